#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

//! Property and robustness tests of the codec layer, one test binary with a module per concern:
//! round trips for every codec and level, malformed input for every decoder, LZO
//! interoperability with the C minilzo reference.

mod gen;
mod lzo_interop;
mod malformed;
mod roundtrip;
