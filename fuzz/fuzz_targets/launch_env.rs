//! The launch environment as `NAME=VALUE` lines: the property of `weft_fuzz_checks::launch_env`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz_checks::launch_env(data));
