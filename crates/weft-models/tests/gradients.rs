//! Gradient checks: Linear, global average pooling and cross-entropy against central finite
//! differences in f64, and the block-wise backward of a small ResNet (with and without
//! checkpointing) against one whole-graph backward.

use candle_core::{DType, Device, Tensor, Var};
use weft_models::resnet::{BlockKind, ResNetConfig, StemKind};
use weft_models::{loss, resnet};
use weft_tensor::{tape, BlockModel, Checkpointing, Mode};

/// Central differences of `f` with respect to every element of `var` (f64).
fn numeric_grad(var: &Var, f: &dyn Fn() -> f64) -> Vec<f64> {
    let base: Vec<f64> = var.flatten_all().unwrap().to_vec1().unwrap();
    let eps = 1e-6;
    (0..base.len())
        .map(|i| {
            let mut v = base.clone();
            v[i] += eps;
            var.set(&Tensor::from_vec(v.clone(), var.shape(), &Device::Cpu).unwrap())
                .unwrap();
            let plus = f();
            v[i] -= 2.0 * eps;
            var.set(&Tensor::from_vec(v, var.shape(), &Device::Cpu).unwrap())
                .unwrap();
            let minus = f();
            var.set(&Tensor::from_vec(base.clone(), var.shape(), &Device::Cpu).unwrap())
                .unwrap();
            (plus - minus) / (2.0 * eps)
        })
        .collect()
}

fn assert_close(analytic: &[f64], numeric: &[f64], what: &str) {
    assert_eq!(analytic.len(), numeric.len());
    for (a, n) in analytic.iter().zip(numeric) {
        // Central differences in f64 with eps 1e-6 are accurate to ~1e-8 relative here.
        assert!(
            (a - n).abs() <= 1e-6 * (1.0 + n.abs()),
            "{what}: analytic {a} vs numeric {n}"
        );
    }
}

#[test]
fn linear_pooling_and_cross_entropy_match_finite_differences() {
    let dev = Device::Cpu;
    let mut store = weft_tensor::ParamStore::new(&dev, DType::F64);
    let mut init = weft_models::layers::Init::new(1);
    let fc = weft_models::layers::Linear::new(&mut store.scope("fc"), &mut init, 3, 4).unwrap();
    let x = Var::from_tensor(&Tensor::randn(0f64, 1.0, (2, 3, 2, 2), &dev).unwrap()).unwrap();
    let labels = Tensor::new(&[1u32, 3], &dev).unwrap();
    let loss = || {
        let pooled = x.mean(3).unwrap().mean(2).unwrap();
        loss::cross_entropy(&fc.forward(&pooled).unwrap(), &labels).unwrap()
    };
    let grads = loss().backward().unwrap();
    let value = || loss().to_scalar::<f64>().unwrap();
    for name in ["fc.weight", "fc.bias"] {
        let var = &store.get(name).unwrap().var;
        let analytic: Vec<f64> = grads
            .get(var)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_close(&analytic, &numeric_grad(var, &value), name);
    }
    let analytic: Vec<f64> = grads
        .get(&x)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_close(&analytic, &numeric_grad(&x, &value), "input");
}

fn tiny_resnet(block: BlockKind, stem: StemKind, seed: u64) -> BlockModel {
    tiny_resnet_in(block, stem, seed, DType::F64)
}

fn tiny_resnet_in(block: BlockKind, stem: StemKind, seed: u64, dtype: DType) -> BlockModel {
    resnet(&tiny_config(block, stem, seed), dtype, &Device::Cpu).unwrap()
}

fn tiny_config(block: BlockKind, stem: StemKind, seed: u64) -> ResNetConfig {
    ResNetConfig {
        block,
        layers: vec![1, 2],
        stem_width: 4,
        widths: vec![4, 8],
        stem,
        num_classes: 3,
        zero_init_residual: false,
        seed,
        channels_last: false,
    }
}

fn grads_by_name(
    model: &BlockModel,
    x: &Tensor,
    labels: &Tensor,
    ckpt: Option<&Checkpointing>,
) -> Vec<(String, Vec<f64>)> {
    let store = model.store();
    let mut out = Vec::new();
    match ckpt {
        None => {
            let logits = model.forward(x, Mode::TRAIN).unwrap();
            let grads = loss::cross_entropy(&logits, labels)
                .unwrap()
                .backward()
                .unwrap();
            for id in store.parameter_ids() {
                let e = &store.entries()[id];
                out.push((
                    e.name.clone(),
                    grads
                        .get(e.tensor())
                        .unwrap()
                        .to_dtype(DType::F64)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1()
                        .unwrap(),
                ));
            }
        }
        Some(ckpt) => {
            let tape = tape::forward(model, x, Mode::TRAIN, ckpt).unwrap();
            let l = loss::cross_entropy(tape.output(), labels).unwrap();
            tape.backward(&l, model, |ready| -> weft_tensor::Result<()> {
                for (id, g) in ready.grads {
                    let g = g.unwrap().to_dtype(DType::F64).unwrap();
                    let g = g.flatten_all().unwrap().to_vec1().unwrap();
                    out.push((store.entries()[id].name.clone(), g));
                }
                Ok(())
            })
            .unwrap();
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn running_stats(model: &BlockModel) -> Vec<f64> {
    let store = model.store();
    store
        .buffer_ids()
        .into_iter()
        .flat_map(|id| {
            store.entries()[id]
                .tensor()
                .to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        })
        .collect()
}

/// The block-wise tape runs the ResNet blocks' own backward passes (`ExplicitBackward`) on
/// f64 CPU tensors; one whole-graph backward goes through Candle's autograd: they must agree.
#[test]
fn resnet_blockwise_and_checkpointed_backward_equal_whole_graph() {
    let cases = [
        (BlockKind::Basic, StemKind::Cifar),
        (BlockKind::Bottleneck, StemKind::Cifar),
        (BlockKind::Basic, StemKind::ImageNet),
    ];
    for (kind, stem) in cases {
        let x = Tensor::randn(0f64, 1.0, (4, 3, 16, 16), &Device::Cpu).unwrap();
        let labels = Tensor::new(&[0u32, 2, 1, 2], &Device::Cpu).unwrap();
        let models: Vec<BlockModel> = (0..3).map(|_| tiny_resnet(kind, stem, 7)).collect();
        assert!(
            models[0].blocks()[..models[0].blocks().len() - 1]
                .iter()
                .all(|b| b.explicit().is_some()),
            "stem and residual blocks differentiate themselves"
        );
        let whole = grads_by_name(&models[0], &x, &labels, None);
        let blockwise = grads_by_name(&models[1], &x, &labels, Some(&Checkpointing::None));
        let checkpointed = grads_by_name(&models[2], &x, &labels, Some(&Checkpointing::All));
        for other in [&blockwise, &checkpointed] {
            assert_eq!(whole.len(), other.len());
            for ((name, a), (_, b)) in whole.iter().zip(other.iter()) {
                let a_max = a.iter().fold(0f64, |m, v| m.max(v.abs()));
                for (x, y) in a.iter().zip(b) {
                    // The same f64 arithmetic but for the order of summation.
                    assert!(
                        (x - y).abs() <= 1e-10 * (1.0 + a_max),
                        "{kind:?} {stem:?} {name}: {x} vs {y}"
                    );
                }
            }
        }
        let stats = running_stats(&models[0]);
        assert_eq!(
            stats,
            running_stats(&models[1]),
            "{kind:?}: block-wise BN statistics differ"
        );
        assert_eq!(
            stats,
            running_stats(&models[2]),
            "{kind:?}: checkpointing updated BN statistics twice"
        );
    }
}

#[test]
fn checkpointing_holds_fewer_activation_bytes() {
    let model = tiny_resnet(BlockKind::Basic, StemKind::Cifar, 1);
    let x = Tensor::randn(0f64, 1.0, (4, 3, 8, 8), &Device::Cpu).unwrap();
    let plain = tape::forward(&model, &x, Mode::TRAIN, &Checkpointing::None)
        .unwrap()
        .saved_activation_bytes();
    let ckpt = tape::forward(&model, &x, Mode::TRAIN, &Checkpointing::All)
        .unwrap()
        .saved_activation_bytes();
    assert!(ckpt * 2 < plain, "checkpointed {ckpt} B vs plain {plain} B");
}

/// `‖a − b‖ / ‖a‖` over every parameter's gradient.
fn relative_l2(a: &[(String, Vec<f64>)], b: &[(String, Vec<f64>)]) -> f64 {
    let (mut diff, mut norm) = (0.0, 0.0);
    for ((_, a), (_, b)) in a.iter().zip(b) {
        for (x, y) in a.iter().zip(b) {
            diff += (x - y) * (x - y);
            norm += x * x;
        }
    }
    (diff / norm).sqrt()
}

/// A bf16/f16 ResNet on the CPU takes the same graph-free path as on a GPU (16-bit data, f32
/// batch-norm statistics; each kernel is checked exactly against f32 in weft-tensor). Here the
/// whole model: its block-wise gradients agree with the whole 16-bit graph (composed Candle
/// ops rounding each output), and both with the f64 model of the same seed.
///
/// Bounds, in units of the type's rounding step u (2^-11 for f16, 2^-8 for bf16), as relative
/// L2 errors: block-wise against the whole graph 8u (measured 2u f16, 1.4u bf16: the same
/// roundings in another order); the head's gradients, one layer from the loss, against f64
/// 16u (measured 8u). The whole gradient against f64 only within a half (f16: 0.12, bf16:
/// 0.32 measured), since 16-bit roundings flip ReLU masks and max-pool choices of this tiny
/// net and batch norms over as few as 16 elements amplify them (f32 lands 2e-6 from f64).
#[test]
fn resnet_in_16_bit_takes_the_graph_free_path_and_agrees_with_f64() {
    let x = (Tensor::arange(0u32, 8 * 3 * 32 * 32, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        * 0.37)
        .unwrap()
        .sin()
        .unwrap()
        .reshape((8, 3, 32, 32))
        .unwrap();
    let labels = Tensor::new(&[0u32, 2, 1, 2, 1, 0, 0, 2], &Device::Cpu).unwrap();
    let kind = (BlockKind::Bottleneck, StemKind::ImageNet);
    let reference = grads_by_name(&tiny_resnet(kind.0, kind.1, 7), &x, &labels, None);
    let head = |grads: &[(String, Vec<f64>)]| -> Vec<(String, Vec<f64>)> {
        grads
            .iter()
            .filter(|(name, _)| name.starts_with("fc."))
            .cloned()
            .collect()
    };
    for (dtype, unit) in [(DType::F16, 2f64.powi(-11)), (DType::BF16, 2f64.powi(-8))] {
        let model = || tiny_resnet_in(kind.0, kind.1, 7, dtype);
        let x = x.to_dtype(dtype).unwrap();
        assert!(weft_tensor::ops::has_kernels(&x));
        let whole = grads_by_name(&model(), &x, &labels, None);
        let blockwise = grads_by_name(&model(), &x, &labels, Some(&Checkpointing::None));
        let same = relative_l2(&whole, &blockwise);
        assert!(
            same <= 8.0 * unit,
            "{dtype:?}: block-wise against whole graph {same}"
        );
        for (path, grads) in [("whole graph", &whole), ("block-wise", &blockwise)] {
            let at_head = relative_l2(&head(&reference), &head(grads));
            assert!(at_head <= 16.0 * unit, "{dtype:?} {path}: head {at_head}");
            let all = relative_l2(&reference, grads);
            assert!(all <= 0.5, "{dtype:?} {path}: all gradients {all}");
        }
    }
}

/// A ResNet asked to run channels-last (the stem converts its input; on the CPU the kernels
/// compute in NCHW) gives the NCHW network's gradients and running statistics: the same f64
/// arithmetic.
#[test]
fn channels_last_resnet_equals_the_nchw_one() {
    let x = Tensor::randn(0f64, 1.0, (4, 3, 16, 16), &Device::Cpu).unwrap();
    let labels = Tensor::new(&[0u32, 2, 1, 2], &Device::Cpu).unwrap();
    let build = |channels_last: bool| {
        let config = tiny_config(BlockKind::Bottleneck, StemKind::ImageNet, 3);
        resnet(
            &config.with_channels_last(channels_last),
            DType::F64,
            &Device::Cpu,
        )
        .unwrap()
    };
    let (nchw, cl) = (build(false), build(true));
    for ckpt in [None, Some(&Checkpointing::None)] {
        let a = grads_by_name(&nchw, &x, &labels, ckpt);
        let b = grads_by_name(&cl, &x, &labels, ckpt);
        for ((name, a), (_, b)) in a.iter().zip(&b) {
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-12 * (1.0 + x.abs()),
                    "{name}: {x} vs {y}"
                );
            }
        }
    }
    assert_eq!(running_stats(&nchw), running_stats(&cl));
}
