//! An image file's bytes decoded as a dataset decodes them, then transformed: the property of `weft_fuzz_checks::image_decode`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| weft_fuzz_checks::image_decode(data));
