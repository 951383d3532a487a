//! Arbitrary bytes sent to a live rendezvous store server: the property of `weft_fuzz_checks::store_server`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz_checks::store_server(data));
