//! Errors that cross process boundaries. Each has a stable numeric code (the protobuf
//! `ErrorCode`); retriable ones carry what the caller needs to retry well.

use serde::{Deserialize, Serialize};

use crate::types::{Epoch, NodeId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    Internal,
    InvalidArgument,
    StaleEpoch,
    NotPrimary,
    PartitionUnavailable,
    NoSuchTable,
    DuplicateKey,
    KeyNotFound,
    TableFull,
    TypeMismatch,
    TooLarge,
    NotLeader,
    TableExists,
    Timeout,
    NodeNotReady,
    Overloaded,
    NullViolation,
    DiskError,
    LockWaitTimeout,
    TxnAborted,
    TooManyLocks,
    UserExists,
    NoSuchUser,
    NoSuchGrant,
    SchemaChanged,
    TriggerExists,
    NoSuchTrigger,
}

impl ErrorCode {
    /// The stable number on the wire (`shoal.v1.ErrorCode`).
    pub fn number(self) -> i32 {
        use crate::pb::ErrorCode as P;
        (match self {
            ErrorCode::Internal => P::Internal,
            ErrorCode::InvalidArgument => P::InvalidArgument,
            ErrorCode::StaleEpoch => P::StaleEpoch,
            ErrorCode::NotPrimary => P::NotPrimary,
            ErrorCode::PartitionUnavailable => P::PartitionUnavailable,
            ErrorCode::NoSuchTable => P::NoSuchTable,
            ErrorCode::DuplicateKey => P::DuplicateKey,
            ErrorCode::KeyNotFound => P::KeyNotFound,
            ErrorCode::TableFull => P::TableFull,
            ErrorCode::TypeMismatch => P::TypeMismatch,
            ErrorCode::TooLarge => P::TooLarge,
            ErrorCode::NotLeader => P::NotLeader,
            ErrorCode::TableExists => P::TableExists,
            ErrorCode::Timeout => P::Timeout,
            ErrorCode::NodeNotReady => P::NodeNotReady,
            ErrorCode::Overloaded => P::Overloaded,
            ErrorCode::NullViolation => P::NullViolation,
            ErrorCode::DiskError => P::DiskError,
            ErrorCode::LockWaitTimeout => P::LockWaitTimeout,
            ErrorCode::TxnAborted => P::TxnAborted,
            ErrorCode::TooManyLocks => P::TooManyLocks,
            ErrorCode::UserExists => P::UserExists,
            ErrorCode::NoSuchUser => P::NoSuchUser,
            ErrorCode::NoSuchGrant => P::NoSuchGrant,
            ErrorCode::SchemaChanged => P::SchemaChanged,
            ErrorCode::TriggerExists => P::TriggerExists,
            ErrorCode::NoSuchTrigger => P::NoSuchTrigger,
        }) as i32
    }

    pub fn from_number(n: i32) -> ErrorCode {
        use crate::pb::ErrorCode as P;
        match P::try_from(n).unwrap_or(P::Internal) {
            P::Ok | P::Internal => ErrorCode::Internal,
            P::InvalidArgument => ErrorCode::InvalidArgument,
            P::StaleEpoch => ErrorCode::StaleEpoch,
            P::NotPrimary => ErrorCode::NotPrimary,
            P::PartitionUnavailable => ErrorCode::PartitionUnavailable,
            P::NoSuchTable => ErrorCode::NoSuchTable,
            P::DuplicateKey => ErrorCode::DuplicateKey,
            P::KeyNotFound => ErrorCode::KeyNotFound,
            P::TableFull => ErrorCode::TableFull,
            P::TypeMismatch => ErrorCode::TypeMismatch,
            P::TooLarge => ErrorCode::TooLarge,
            P::NotLeader => ErrorCode::NotLeader,
            P::TableExists => ErrorCode::TableExists,
            P::Timeout => ErrorCode::Timeout,
            P::NodeNotReady => ErrorCode::NodeNotReady,
            P::Overloaded => ErrorCode::Overloaded,
            P::NullViolation => ErrorCode::NullViolation,
            P::DiskError => ErrorCode::DiskError,
            P::LockWaitTimeout => ErrorCode::LockWaitTimeout,
            P::TxnAborted => ErrorCode::TxnAborted,
            P::TooManyLocks => ErrorCode::TooManyLocks,
            P::UserExists => ErrorCode::UserExists,
            P::NoSuchUser => ErrorCode::NoSuchUser,
            P::NoSuchGrant => ErrorCode::NoSuchGrant,
            P::SchemaChanged => ErrorCode::SchemaChanged,
            P::TriggerExists => ErrorCode::TriggerExists,
            P::NoSuchTrigger => ErrorCode::NoSuchTrigger,
        }
    }

    /// Short stable name, used in logs and CLI output.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::StaleEpoch => "STALE_EPOCH",
            ErrorCode::NotPrimary => "NOT_PRIMARY",
            ErrorCode::PartitionUnavailable => "PARTITION_UNAVAILABLE",
            ErrorCode::NoSuchTable => "NO_SUCH_TABLE",
            ErrorCode::DuplicateKey => "DUPLICATE_KEY",
            ErrorCode::KeyNotFound => "KEY_NOT_FOUND",
            ErrorCode::TableFull => "TABLE_FULL",
            ErrorCode::TypeMismatch => "TYPE_MISMATCH",
            ErrorCode::TooLarge => "TOO_LARGE",
            ErrorCode::NotLeader => "NOT_LEADER",
            ErrorCode::TableExists => "TABLE_EXISTS",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::NodeNotReady => "NODE_NOT_READY",
            ErrorCode::Overloaded => "OVERLOADED",
            ErrorCode::NullViolation => "NULL_VIOLATION",
            ErrorCode::DiskError => "DISK_ERROR",
            ErrorCode::LockWaitTimeout => "LOCK_WAIT_TIMEOUT",
            ErrorCode::TxnAborted => "TXN_ABORTED",
            ErrorCode::TooManyLocks => "TOO_MANY_LOCKS",
            ErrorCode::UserExists => "USER_EXISTS",
            ErrorCode::NoSuchUser => "NO_SUCH_USER",
            ErrorCode::NoSuchGrant => "NO_SUCH_GRANT",
            ErrorCode::SchemaChanged => "SCHEMA_CHANGED",
            ErrorCode::TriggerExists => "TRIGGER_EXISTS",
            ErrorCode::NoSuchTrigger => "NO_SUCH_TRIGGER",
        }
    }

    /// Whether the same request may succeed when sent again after refreshing the cluster map.
    pub fn is_retriable(self) -> bool {
        matches!(
            self,
            ErrorCode::StaleEpoch
                | ErrorCode::NotPrimary
                | ErrorCode::NotLeader
                | ErrorCode::Timeout
                | ErrorCode::NodeNotReady
                | ErrorCode::Overloaded
                | ErrorCode::PartitionUnavailable
                | ErrorCode::DiskError
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", code.name())]
pub struct ShoalError {
    pub code: ErrorCode,
    pub message: String,
    /// StaleEpoch: the newest epoch the answering node knows.
    pub current_epoch: Epoch,
    /// NotPrimary / NotLeader: whom to ask instead (0 = unknown).
    pub hint: NodeId,
    pub hint_addr: String,
}

impl ShoalError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ShoalError {
        ShoalError { code, message: message.into(), current_epoch: 0, hint: 0, hint_addr: String::new() }
    }

    pub fn stale_epoch(current: Epoch, got: Epoch) -> ShoalError {
        let mut e = ShoalError::new(
            ErrorCode::StaleEpoch,
            format!("request epoch {got} is older than the node's epoch {current}"),
        );
        e.current_epoch = current;
        e
    }

    pub fn not_primary(hint: Option<NodeId>, what: impl Into<String>) -> ShoalError {
        let mut e = ShoalError::new(ErrorCode::NotPrimary, what);
        e.hint = hint.unwrap_or(0);
        e
    }

    pub fn internal(msg: impl Into<String>) -> ShoalError {
        ShoalError::new(ErrorCode::Internal, msg)
    }

    pub fn is_retriable(&self) -> bool {
        self.code.is_retriable()
    }
}
