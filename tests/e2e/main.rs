//! End-to-end tests: real guest components (built by `eddy-guest-artifacts`) through the real
//! runtime. One test binary, one module per concern.

mod cache;
mod checkpoints;
mod engine;
mod examples;
mod hostile;
mod kafka;
mod live_swap;
mod load;
mod nexmark;
mod operators;
mod polyglot;
mod postgres;
mod recovery;
mod replay;
mod spread;
mod state;
mod unaligned;
mod windows;
