//! The rendezvous store's frames: decoding arbitrary bytes never panics, and whatever decodes
//! encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    weft_collectives::store::fuzzing::decode_frames(data);
});
