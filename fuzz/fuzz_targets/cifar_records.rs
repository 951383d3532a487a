//! CIFAR-10 bytes: whatever the checks accept must yield every one of its samples.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use weft_data::{Cifar10, Dataset};

fuzz_target!(|data: &[u8]| {
    if let Ok(dataset) = Cifar10::from_bytes(Path::new("fuzz.bin"), data.to_vec()) {
        for i in 0..dataset.len() {
            let sample = dataset.get(i).expect("an accepted record reads");
            assert!((sample.label as usize) < dataset.num_classes());
        }
        assert!(dataset.get(dataset.len()).is_err());
    }
});
