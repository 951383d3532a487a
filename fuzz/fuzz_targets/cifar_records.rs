//! CIFAR-10 bytes: the property of `weft_fuzz_checks::cifar_records`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz_checks::cifar_records(data));
