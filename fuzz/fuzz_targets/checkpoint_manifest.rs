//! A sharded checkpoint's `manifest.json`: the property of `weft_fuzz_checks::checkpoint_manifest`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz_checks::checkpoint_manifest(data));
