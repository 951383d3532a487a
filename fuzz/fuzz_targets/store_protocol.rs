//! The rendezvous store's frames: the property of `weft_fuzz_checks::store_protocol`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz_checks::store_protocol(data));
