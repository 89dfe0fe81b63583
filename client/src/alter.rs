//! ALTER TABLE by copy, from the client side: the catalog changes around it. The SQL node
//! creates the copy in the new layout, marks the table read-only (data nodes then refuse its
//! writes retriably), copies the rows, and swaps the copy in under the old name.

use shoal_proto::pb;
use shoal_proto::Table;

use crate::{table_of, Client, Result};

impl Client {
    /// Refuses (`true`) or allows again writes to `table`; returns the table as it is now.
    pub async fn set_read_only(&self, table: &str, read_only: bool) -> Result<Table> {
        let req = pb::SetReadOnlyRequest { table: table.to_string(), read_only };
        let resp = self.catalog_change(req, |mut c, r| async move { c.set_read_only(r).await }).await?;
        table_of(resp)
    }

    /// Drops `table` and gives its name to `with`, in one catalog change.
    pub async fn replace_table(&self, table: &str, with: &str) -> Result<Table> {
        let req = pb::ReplaceTableRequest { table: table.to_string(), with: with.to_string() };
        let resp = self.catalog_change(req, |mut c, r| async move { c.replace_table(r).await }).await?;
        table_of(resp)
    }

    /// Renames tables, each `(from, to)` in order, all or none, in one catalog change (RENAME
    /// TABLE): the rows and indexes stay where they are. Returns the last table renamed.
    pub async fn rename_tables(&self, renames: &[(String, String)]) -> Result<Table> {
        let renames = renames.iter().map(|(from, to)| pb::TableRename { from: from.clone(), to: to.clone() }).collect();
        let req = pb::RenameTablesRequest { renames };
        let resp = self.catalog_change(req, |mut c, r| async move { c.rename_tables(r).await }).await?;
        table_of(resp)
    }
}
