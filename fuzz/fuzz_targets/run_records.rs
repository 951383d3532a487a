//! A run's records (`progress.json`, `tensor-parallel.json`) read as a resume reads them: the property of `weft_fuzz_checks::run_records`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz_checks::run_records(data));
