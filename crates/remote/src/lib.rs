//! Reaching another host: the protocol (`wire`), the side that answers
//! (`serve`, run by `sluice serve --stdio`) and the side that asks
//! (`client::RemoteSource`, a [`sluice_engine::source::Source`]).
//!
//! The engine runs where DST is, next to the many small writes every file
//! costs (create, write, set metadata, rename: a round trip each, were
//! they made across the wire); what crosses the wire is SRC's side: one
//! exchange per directory listed (stats included) and reads of file data.

#![forbid(unsafe_code)]

pub mod client;
pub mod peer;
pub mod serve;
pub mod streams;
pub mod wire;

pub use client::{connect, RemoteSource};
pub use peer::{ConnectError, Handler, Peer};
pub use serve::{serve, RunJob};
