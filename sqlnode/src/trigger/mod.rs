//! Row triggers (CREATE TRIGGER … FOR EACH ROW). The catalog keeps them with their table
//! (`shoal_proto::Trigger`, one mgmd command each to create and drop), so every SQL node has
//! them in its cluster map and a write to a table without triggers pays nothing. `parse` reads
//! the statements and bodies; `run` creates, shows and fires them.

pub mod parse;
pub mod run;

pub use run::{has_triggers, RowPair};
