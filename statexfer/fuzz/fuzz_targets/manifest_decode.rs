//! Arbitrary bytes as an ISM1 manifest. Decoding never panics, and a manifest that
//! decodes re-encodes to bytes that decode to the same entries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use statexfer::Manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(manifest) = Manifest::decode(data) {
        let again = Manifest::decode(&manifest.encode()).expect("re-encoded manifest decodes");
        assert_eq!(again, manifest);
    }
});
