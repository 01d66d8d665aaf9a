//! Shared by the decoder targets: the first two input bytes choose the expected decoded length
//! (up to 64 KiB, plus 1 MiB when both are 0xFF), the rest is the compressed extent.

use compfs_codec::{Algorithm, CodecError, Decompressor, MAX_EXTENT};

pub fn decode(algorithm: Algorithm, data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let len = match u16::from_le_bytes([data[0], data[1]]) {
        0xFFFF => MAX_EXTENT,
        n => n as usize,
    };
    let mut dst = vec![0u8; len];
    match Decompressor::new().decompress(algorithm, &data[2..], &mut dst) {
        Ok(()) | Err(CodecError::Corrupt { .. }) => {}
        Err(e) => panic!("{algorithm}: unexpected error kind {e:?}"),
    }
}
