//! The SQL layer without sockets or cluster: parsing, binding, expressions and access paths.

pub mod bind;
pub mod expr;
pub mod parse;
pub mod plan;
