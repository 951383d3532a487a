//! The `--data` flag: which data set to train and validate on, with which transforms.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use weft_data::{
    Cifar10, Dataset, ImageFolder, Pipeline, Split, SyntheticConfig, SyntheticShapes, SHAPE_NAMES,
    VALIDATION_SEED_SALT,
};

use crate::flags::{Augment, ImageDataFlags};

/// A parsed `--data` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSpec {
    Synthetic,
    Cifar10(PathBuf),
    ImageFolder(PathBuf),
}

impl DataSpec {
    /// Parses `synthetic`, `cifar10:PATH` or `imagefolder:PATH`; the path must exist.
    pub fn parse(value: &str) -> Result<Self> {
        if value == "synthetic" {
            return Ok(DataSpec::Synthetic);
        }
        let (kind, path) = value.split_once(':').with_context(|| {
            format!("--data {value}: expected synthetic, cifar10:PATH or imagefolder:PATH")
        })?;
        let path = PathBuf::from(path);
        if !path.is_dir() {
            bail!("--data {value}: {} is not a folder", path.display());
        }
        match kind {
            "cifar10" => Ok(DataSpec::Cifar10(path)),
            "imagefolder" => Ok(DataSpec::ImageFolder(path)),
            other => bail!(
                "--data {value}: unknown data set kind `{other}`; expected cifar10 or imagefolder"
            ),
        }
    }
}

/// Training and validation sets with their transforms.
pub struct DataSets {
    pub train: Arc<dyn Dataset>,
    pub train_pipeline: Arc<Pipeline>,
    pub val: Arc<dyn Dataset>,
    pub val_pipeline: Arc<Pipeline>,
    pub num_classes: usize,
}

/// Opens the data sets named by `--data`.
pub fn open(data: &ImageDataFlags, num_classes: Option<usize>, seed: u64) -> Result<DataSets> {
    let augment = data.augment == Augment::Default;
    let size = data.image_size;
    let (train, val, train_pipeline, val_pipeline): (
        Arc<dyn Dataset>,
        Arc<dyn Dataset>,
        Pipeline,
        Pipeline,
    ) = match DataSpec::parse(&data.data)? {
        DataSpec::Synthetic => {
            let config = SyntheticConfig {
                num_samples: data.synthetic_train,
                // A larger --num-classes widens the model's head; the data keeps its 10 shapes.
                num_classes: num_classes.unwrap_or(10).min(SHAPE_NAMES.len()),
                image_size: size,
                seed,
                ..SyntheticConfig::default()
            };
            let val_config = SyntheticConfig {
                num_samples: data.synthetic_val,
                seed: seed ^ VALIDATION_SEED_SALT,
                ..config.clone()
            };
            let train_pipeline = if augment {
                Pipeline::cifar_train(size)
            } else {
                Pipeline::cifar_eval()
            };
            (
                Arc::new(SyntheticShapes::new(config)?),
                Arc::new(SyntheticShapes::new(val_config)?),
                train_pipeline,
                Pipeline::cifar_eval(),
            )
        }
        DataSpec::Cifar10(root) => {
            if size != 32 {
                bail!("--image-size {size}: CIFAR-10 images are 32x32");
            }
            let train_pipeline = if augment {
                Pipeline::cifar_train(32)
            } else {
                Pipeline::cifar_eval()
            };
            (
                Arc::new(Cifar10::open(&root, Split::Train)?),
                Arc::new(Cifar10::open(&root, Split::Test)?),
                train_pipeline,
                Pipeline::cifar_eval(),
            )
        }
        DataSpec::ImageFolder(root) => {
            let eval = Pipeline::imagenet_eval(size);
            let train_pipeline = if augment {
                Pipeline::imagenet_train(size)
            } else {
                Pipeline::imagenet_eval(size)
            };
            // Validation's classes must be training's: a missing one would shift every later
            // label.
            let train = ImageFolder::open(root.join("train"))?;
            let val = train.open_validation(root.join("val"))?;
            (Arc::new(train), Arc::new(val), train_pipeline, eval)
        }
    };
    let num_classes = num_classes.unwrap_or(train.num_classes());
    if num_classes < train.num_classes() {
        bail!(
            "--num-classes {num_classes}: the data set has {} classes",
            train.num_classes()
        );
    }
    Ok(DataSets {
        train,
        train_pipeline: Arc::new(train_pipeline),
        val,
        val_pipeline: Arc::new(val_pipeline),
        num_classes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs_and_names_bad_ones() {
        assert_eq!(DataSpec::parse("synthetic").unwrap(), DataSpec::Synthetic);
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("cifar10:{}", dir.path().display());
        assert_eq!(
            DataSpec::parse(&spec).unwrap(),
            DataSpec::Cifar10(dir.path().into())
        );
        assert!(DataSpec::parse("cifar10:/no/such/dir")
            .unwrap_err()
            .to_string()
            .contains("/no/such/dir"));
        assert!(DataSpec::parse("mnist")
            .unwrap_err()
            .to_string()
            .contains("--data mnist"));
        let spec = format!("mnist:{}", dir.path().display());
        assert!(DataSpec::parse(&spec)
            .unwrap_err()
            .to_string()
            .contains("`mnist`"));
    }
}
