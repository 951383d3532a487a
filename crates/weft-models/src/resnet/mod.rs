//! The ResNet family as block models: `stem`, one block per residual block (`layer1.0`, …),
//! `head`. Parameter names and order equal torchvision's `state_dict()` keys, so torchvision
//! weights exported to safetensors load directly.

mod blocks;
mod config;

use candle_core::{DType, Device};
use weft_tensor::{Block, BlockModel, CrossRankSlot, ParamStore};

pub use blocks::{Head, Residual, ResidualSpec, Stem};
pub use config::{BlockKind, ResNetConfig, Stem as StemKind, MODEL_NAMES};

use crate::error::Result;
use crate::layers::Init;

/// Builds the ResNet described by `config` with parameters of `dtype` on `device`.
pub fn resnet(config: &ResNetConfig, dtype: DType, device: &Device) -> Result<BlockModel> {
    let mut store = ParamStore::new(device, dtype);
    let mut init = Init::new(config.seed);
    let mut root = store.scope("");
    let mut blocks: Vec<Box<dyn Block>> = Vec::new();
    let sync = CrossRankSlot::default();
    blocks.push(Box::new(Stem::new(
        &mut root,
        &mut init,
        config.stem,
        config.stem_width,
        config.channels_last,
        &sync,
    )?));
    let mut in_ch = config.stem_width;
    for (stage, (&count, &planes)) in config.layers.iter().zip(&config.widths).enumerate() {
        let layer = format!("layer{}", stage + 1);
        for index in 0..count {
            let spec = ResidualSpec {
                kind: config.block,
                in_ch,
                planes,
                stride: if stage > 0 && index == 0 { 2 } else { 1 },
                zero_init_residual: config.zero_init_residual,
                sync: sync.clone(),
            };
            let name = format!("{layer}.{index}");
            let block = Residual::new(&mut root.sub(&name), &mut init, name, &spec)?;
            blocks.push(Box::new(block));
            in_ch = planes * config.block.expansion();
        }
    }
    blocks.push(Box::new(Head::new(
        &mut root,
        &mut init,
        in_ch,
        config.num_classes,
    )?));
    Ok(BlockModel::new(store, blocks)?.with_batch_stats_slot(sync))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(name: &str, classes: usize) -> usize {
        let config = ResNetConfig::from_name(name, classes).unwrap();
        resnet(&config, DType::F32, &Device::Cpu)
            .unwrap()
            .store()
            .num_parameters()
    }

    #[test]
    fn parameter_counts_match_torchvision() {
        assert_eq!(count("resnet50", 1000), 25_557_032);
        assert_eq!(count("resnet50", 10), 23_528_522);
        assert_eq!(count("resnet18", 1000), 11_689_512);
    }

    #[test]
    fn names_follow_torchvision_state_dict_order() {
        let config = ResNetConfig::from_name("resnet50", 1000).unwrap();
        let model = resnet(&config, DType::F32, &Device::Cpu).unwrap();
        let names: Vec<&str> = model
            .store()
            .entries()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(
            &names[..7],
            [
                "conv1.weight",
                "bn1.weight",
                "bn1.bias",
                "bn1.running_mean",
                "bn1.running_var",
                "bn1.num_batches_tracked",
                "layer1.0.conv1.weight"
            ]
        );
        assert!(names.contains(&"layer2.0.downsample.0.weight"));
        assert!(names.contains(&"layer4.2.bn3.num_batches_tracked"));
        assert_eq!(&names[names.len() - 2..], ["fc.weight", "fc.bias"]);
        assert_eq!(
            names.len(),
            320,
            "torchvision resnet50 has 320 state_dict entries"
        );
        let shape = model
            .store()
            .get("layer3.0.conv2.weight")
            .unwrap()
            .var
            .dims()
            .to_vec();
        assert_eq!(shape, [256, 256, 3, 3]);
        assert_eq!(model.blocks().len(), 1 + 16 + 1);
        assert_eq!(model.blocks()[1].name(), "layer1.0");
    }

    #[test]
    fn zero_init_residual_zeroes_the_last_bn_of_each_branch() {
        let config = ResNetConfig::from_name("resnet18", 10)
            .unwrap()
            .with_zero_init_residual(true);
        let model = resnet(&config, DType::F32, &Device::Cpu).unwrap();
        let w: Vec<f32> = model
            .store()
            .get("layer1.0.bn2.weight")
            .unwrap()
            .tensor()
            .to_vec1()
            .unwrap();
        assert!(w.iter().all(|&v| v == 0.0));
        let w: Vec<f32> = model
            .store()
            .get("layer1.0.bn1.weight")
            .unwrap()
            .tensor()
            .to_vec1()
            .unwrap();
        assert!(w.iter().all(|&v| v == 1.0));
    }

    fn values(store: &ParamStore, name: &str) -> Vec<f32> {
        let t = store.get(name).unwrap().tensor().flatten_all().unwrap();
        t.to_vec1().unwrap()
    }

    fn mean_and_std(v: &[f32]) -> (f64, f64) {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt())
    }

    /// torchvision's initialisation: convolutions `kaiming_normal_(mode="fan_out",
    /// nonlinearity="relu")`, std `sqrt(2 / (out_channels · k · k))`; BatchNorm weight 1 and
    /// bias 0; the classifier PyTorch's `Linear` default, uniform in `±1/sqrt(in_features)`.
    #[test]
    fn initialisation_follows_torchvision() {
        let model = resnet(
            &ResNetConfig::from_name("resnet18", 1000).unwrap(),
            DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        let store = model.store();
        // (name, out_channels * k * k): 37,632 to 2.4 M samples, so the sample std is within 1.5 %.
        for (name, fan_out) in [
            ("conv1.weight", 64 * 49),
            ("layer1.0.conv1.weight", 64 * 9),
            ("layer4.1.conv2.weight", 512 * 9),
            ("layer2.0.downsample.0.weight", 128),
        ] {
            let (mean, std) = mean_and_std(&values(store, name));
            let expected = (2.0 / fan_out as f64).sqrt();
            assert!(mean.abs() < 0.02 * expected, "{name}: mean {mean}");
            assert!(
                (std / expected - 1.0).abs() < 0.015,
                "{name}: std {std}, expected {expected}"
            );
        }
        assert!(values(store, "bn1.weight").iter().all(|&v| v == 1.0));
        assert!(values(store, "layer3.1.bn2.bias").iter().all(|&v| v == 0.0));
        let bound = 1.0 / 512f32.sqrt();
        for name in ["fc.weight", "fc.bias"] {
            let v = values(store, name);
            assert!(
                v.iter().all(|x| x.abs() <= bound),
                "{name} outside ±{bound}"
            );
            let (_, std) = mean_and_std(&v);
            // Uniform on ±b has std b/sqrt(3); fc.bias has only 1000 samples.
            let expected = bound as f64 / 3f64.sqrt();
            assert!((std / expected - 1.0).abs() < 0.1, "{name}: std {std}");
        }
    }

    #[test]
    fn same_seed_same_init_and_unknown_names_are_errors() {
        let config = ResNetConfig::from_name("resnet20", 10)
            .unwrap()
            .with_seed(3);
        let a = resnet(&config, DType::F32, &Device::Cpu).unwrap();
        let b = resnet(&config, DType::F32, &Device::Cpu).unwrap();
        let wa = values(a.store(), "conv1.weight");
        let wb = values(b.store(), "conv1.weight");
        assert_eq!(wa, wb);
        let err = ResNetConfig::from_name("resnet7", 10)
            .unwrap_err()
            .to_string();
        assert!(err.contains("resnet7") && err.contains("resnet50"), "{err}");
    }
}
