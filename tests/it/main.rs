//! The one integration-test binary: drives the real `sluice` on real file
//! systems (the disk under the target dir, tmpfs, and loop-mounted
//! ext4/xfs/btrfs when root) and compares the resulting bytes and metadata.

mod cli;
mod common;
mod copy;
mod faults;
mod fs;
mod image;
mod limits;
mod network;
mod probe;
#[cfg(feature = "mpi")]
mod ranks;
mod remote;
mod resume;
mod safety;
mod shard;
mod sync;
mod tune;
mod verify;
mod watch;
