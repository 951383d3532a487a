//! Parsing `--device cpu|cuda|cuda:N` into a Candle device; a bare `cuda` in a launched job
//! is the rank's own GPU.

use anyhow::{bail, Context, Result};
use candle_core::Device;

/// Which device a `--device` value names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
}

/// Parses a `--device` value.
pub fn parse_device(value: &str) -> Result<DeviceSpec> {
    match value {
        "cpu" => Ok(DeviceSpec::Cpu),
        "cuda" => Ok(DeviceSpec::Cuda(0)),
        other => match other.strip_prefix("cuda:") {
            Some(n) => Ok(DeviceSpec::Cuda(n.parse().with_context(|| {
                format!("--device {other}: `{n}` is not a GPU index")
            })?)),
            None => bail!("--device {other}: expected cpu, cuda or cuda:N"),
        },
    }
}

/// The number of GPUs this process can see (0 in a build without the `cuda` feature or
/// without a driver).
pub fn visible_gpus() -> usize {
    #[cfg(feature = "cuda")]
    {
        use candle_core::cuda_backend::cudarc::driver::result;
        if result::init().is_ok() {
            return result::device::get_count().map_or(0, |n| n.max(0) as usize);
        }
    }
    0
}

/// Like [`parse_device`], but a bare `cuda` in a launched job means this rank's GPU,
/// `cuda:LOCAL_RANK` (or `SLURM_LOCALID`), one GPU per process as torchrun jobs do.
pub fn parse_device_for_rank(value: &str) -> Result<DeviceSpec> {
    if value != "cuda" {
        return parse_device(value);
    }
    let local_rank = std::env::var("LOCAL_RANK")
        .or_else(|_| std::env::var("SLURM_LOCALID"))
        .ok();
    match local_rank {
        None => Ok(DeviceSpec::Cuda(0)),
        Some(text) => Ok(DeviceSpec::Cuda(text.trim().parse().with_context(
            || format!("--device cuda: LOCAL_RANK {text:?} is not a GPU index"),
        )?)),
    }
}

impl DeviceSpec {
    /// Opens the device; a CUDA device in a build without the `cuda` feature is an error saying so.
    /// A GPU is set up for training (`weft_tensor::cuda_runtime::configure`'s defaults: freed
    /// memory kept in the pool, no per-allocation event tracking).
    pub fn open(self) -> Result<Device> {
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(index) => {
                if !cfg!(feature = "cuda") {
                    bail!(
                        "--device cuda:{index}: this binary was built without the `cuda` feature"
                    );
                }
                let device = Device::new_cuda(index)
                    .with_context(|| format!("--device cuda:{index}: cannot open the GPU"))?;
                #[cfg(feature = "cuda")]
                weft_tensor::cuda_runtime::configure(&device, Default::default())
                    .with_context(|| format!("--device cuda:{index}: cannot configure the GPU"))?;
                Ok(device)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices_and_rejects_others() {
        assert_eq!(parse_device("cpu").unwrap(), DeviceSpec::Cpu);
        assert_eq!(parse_device("cuda").unwrap(), DeviceSpec::Cuda(0));
        assert_eq!(parse_device("cuda:3").unwrap(), DeviceSpec::Cuda(3));
        assert!(parse_device("cuda:x")
            .unwrap_err()
            .to_string()
            .contains("`x`"));
        assert!(parse_device("tpu")
            .unwrap_err()
            .to_string()
            .contains("--device tpu"));
    }
}
