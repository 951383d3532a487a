//! Safetensors bytes loaded into a small model: the property of `weft_fuzz_checks::safetensors_load`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz_checks::safetensors_load(data));
