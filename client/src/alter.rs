//! ALTER TABLE by copy, from the client side: the catalog changes around it. The SQL node
//! creates the copy in the new layout, marks the table read-only (data nodes then refuse its
//! writes retriably), copies the rows, and swaps the copy in under the old name.

use shoal_proto::pb;
use shoal_proto::{Column, Table, Trigger};

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

    /// Replaces `table`'s columns by `columns`, which differ from them in names and defaults
    /// only (the rows stay as they are); returns the table as it is now.
    pub async fn set_columns(&self, table: &str, columns: &[Column]) -> Result<Table> {
        let req =
            pb::SetColumnsRequest { table: table.to_string(), columns: columns.iter().map(pb::Column::from).collect() };
        let resp = self.catalog_change(req, |mut c, r| async move { c.set_columns(r).await }).await?;
        table_of(resp)
    }

    /// Renames index `from` of `table` to `to` (ALTER TABLE … RENAME INDEX); returns the table.
    pub async fn rename_index(&self, table: &str, from: &str, to: &str) -> Result<Table> {
        let req = pb::RenameIndexRequest { table: table.to_string(), from: from.to_string(), to: to.to_string() };
        let resp = self.catalog_change(req, |mut c, r| async move { c.rename_index(r).await }).await?;
        table_of(resp)
    }

    /// Adds a trigger to `table` (`db.t`); returns the table as it is now.
    pub async fn create_trigger(&self, table: &str, trigger: &Trigger, if_not_exists: bool) -> Result<Table> {
        let req = pb::CreateTriggerRequest { table: table.to_string(), trigger: Some(trigger.into()), if_not_exists };
        let resp = self.catalog_change(req, |mut c, r| async move { c.create_trigger(r).await }).await?;
        table_of(resp)
    }

    /// Drops trigger `name` of database `db`. `Ok(false)`: there was none (only with `if_exists`).
    pub async fn drop_trigger(&self, db: &str, name: &str, if_exists: bool) -> Result<bool> {
        let req = pb::DropTriggerRequest { database: db.to_string(), name: name.to_string(), if_exists };
        let resp = self.catalog_change(req, |mut c, r| async move { c.drop_trigger(r).await }).await?;
        Ok(resp.table.is_some())
    }
}
