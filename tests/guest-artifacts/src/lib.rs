//! Paths of every guest component, built by this crate's build script from `examples/` and
//! `tests/guests/`. Depend on it from tests and benches that need a real guest.

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));
