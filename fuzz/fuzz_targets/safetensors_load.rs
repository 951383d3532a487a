//! Safetensors bytes loaded into a small model: a refused file is an error, never a panic,
//! and leaves the model as it was.
#![no_main]

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use libfuzzer_sys::fuzz_target;
use weft_tensor::{EntryKind, ParamStore};

fn store() -> ParamStore {
    let mut store = ParamStore::new(&Device::Cpu, DType::F32);
    let weight = Tensor::ones((2, 3), DType::F32, &Device::Cpu).unwrap();
    let bias = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
    let mean = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
    store
        .register("layer.weight", EntryKind::Parameter, weight)
        .unwrap();
    store
        .register("layer.bias", EntryKind::Parameter, bias)
        .unwrap();
    store
        .register("norm.running_mean", EntryKind::Buffer, mean)
        .unwrap();
    store
}

fuzz_target!(|data: &[u8]| {
    let store = store();
    let origin = Path::new("fuzz.safetensors");
    if weft_tensor::state_dict::load_safetensors_bytes(&store, origin, data).is_err() {
        let weight = store
            .get("layer.weight")
            .unwrap()
            .tensor()
            .flatten_all()
            .unwrap();
        let ones = weight.to_vec1::<f32>().unwrap().iter().all(|&v| v == 1.0);
        assert!(ones, "a refused file changed the model");
    }
});
