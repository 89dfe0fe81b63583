//! Shoal's wire protocol and the validated domain types every process shares.
//!
//! `pb` holds the prost/tonic generated code. Everything else in the system works with the
//! domain types in [`types`]; [`convert`] turns protobuf messages into them (validating) and
//! back. Nothing outside RPC modules should touch `pb` types.

pub mod aggregate;
pub mod alloc;
pub mod codec;
pub mod config;
pub mod convert;
pub mod error;
pub mod file;
pub mod filter;
pub mod grpc;
pub mod grpc_stream;
pub mod hash;
pub mod idle_poll;
pub mod local_stream;
#[cfg(feature = "logging")]
pub mod logging;
pub mod packed_rows;
pub mod spin;
pub mod types;
pub mod users;

/// Generated protobuf and gRPC code.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("shoal.v1");
}

pub use error::{ErrorCode, ShoalError};
/// The byte buffers of `bytes` fields in the protobuf messages.
pub use prost::bytes;
pub use types::*;
pub use users::{AccountName, AuthPlugin, PasswordHashes, UserAccount};
