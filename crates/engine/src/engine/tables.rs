//! Tables: their definitions and indexes, and opening their storage.

use super::*;

impl Engine {
    /// The log settings of a table's partition: compacted, newest row per id.
    pub(super) fn table_config(&self, def: &TableDef) -> PartitionConfig {
        PartitionConfig { durability: def.durability, compacted: true, ..self.options.stream_defaults.clone() }
    }

    pub(super) fn open_table(&self, def: TableDef) -> Result<Arc<Table>, EngineError> {
        let partition = self.log.open_partition(&def.name, 0, self.table_config(&def))?;
        let storage_def = StreamDef {
            name: def.name.clone(),
            partitions: 1,
            retention_ms: None,
            retention_bytes: None,
            durability: def.durability,
            mqtt_topic: None,
            compacted: true,
        };
        Table::open(def, Arc::new(Stream::table_storage(storage_def, partition)), self.replicator.clone())
    }

    pub fn table(&self, name: &str) -> Result<Arc<Table>, EngineError> {
        self.tables
            .read()
            .expect("tables lock")
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::UnknownTable(name.into()))
    }

    /// Writes row `id` of the table `name` ([`Table::write`]). On a cluster node that does not
    /// have the table (it was created through another node, and the creation has not reached
    /// this one yet), the cluster's leader decides, as for every row write.
    pub async fn write_row(
        &self,
        name: &str,
        id: &str,
        write: crate::table::Write,
        precondition: crate::table::Precondition,
        durability: Option<onehop_log::Durability>,
    ) -> Result<crate::table::Written, EngineError> {
        match (self.table(name), self.replicator.get()) {
            (Ok(table), _) => table.write(id, write, precondition, durability).await,
            (Err(EngineError::UnknownTable(_)), Some(replicator)) => {
                crate::table::check_row_id(id)?;
                self.write_row_unknown_here(replicator, name, id, write, precondition).await
            }
            (Err(error), _) => Err(error),
        }
    }

    /// Whether a table named `name` exists (a lookup that builds no error when it does not).
    pub fn has_table(&self, name: &str) -> bool {
        self.tables.read().expect("tables lock").contains_key(name)
    }

    /// Every table, by name.
    pub fn tables(&self) -> Vec<Arc<Table>> {
        self.tables.read().expect("tables lock").values().cloned().collect()
    }

    /// Durability of tables created without saying: the server's default, as for streams.
    pub fn default_table_durability(&self) -> Durability {
        self.options.stream_defaults.durability
    }

    /// Creates the table `def` describes, durably. A table that exists with the same columns
    /// is returned as it is (its indexes are managed by `create_index`); with other columns it
    /// is an error. On a cluster node the cluster creates it, on every node.
    pub async fn create_table(&self, def: TableDef) -> Result<Arc<Table>, EngineError> {
        if self.is_replicated() {
            return self.create_table_replicated(def).await;
        }
        self.create_table_here(def).await
    }

    /// Refuses a new table whose name is another stream's or view's, or that does not fit the
    /// orphaned data of its name.
    pub(super) fn check_new_table(&self, def: &TableDef) -> Result<(), EngineError> {
        if self.stream(&def.name).is_ok() {
            return Err(EngineError::NameTaken { name: def.name.clone(), kind: "stream" });
        }
        if self.view(&def.name).is_ok() {
            return Err(EngineError::NameTaken { name: def.name.clone(), kind: "view" });
        }
        self.check_adoption(&def.name, 1, true, "table")
    }

    /// Creates the table `def` describes on this node.
    pub(super) async fn create_table_here(&self, def: TableDef) -> Result<Arc<Table>, EngineError> {
        def.validate()?;
        let _ddl = self.ddl.lock().await;
        if let Ok(existing) = self.table(&def.name) {
            let existing_def = existing.def();
            if existing_def.without_indexes() == def.without_indexes() {
                return Ok(existing);
            }
            return Err(EngineError::TableExists { name: def.name.clone(), existing: existing_def.describe() });
        }
        self.check_new_table(&def)?;
        self.catalog.append(&[catalog::table_record(&def)]).await?;
        let table = self.open_table(def)?;
        self.adopted(&table.name());
        self.tables.write().expect("tables lock").insert(table.name(), table.clone());
        self.catalog_changed();
        tracing::info!(table = %table.name(), definition = %table.def().describe(), "table created");
        Ok(table)
    }

    /// Creates an index on `field` of `table` (named `name`, or `{table}_{field}_idx`) and
    /// fills it. Returns the index and whether it was created (false: an index on that field
    /// exists already). On a cluster node the cluster creates it, on every node.
    pub async fn create_index(
        &self,
        table: &str,
        name: Option<&str>,
        field: &str,
    ) -> Result<(IndexDef, bool), EngineError> {
        if self.is_replicated() {
            return self.create_index_replicated(table, name, field).await;
        }
        self.create_index_here(table, name, field).await
    }

    /// Creates an index on this node.
    pub(super) async fn create_index_here(
        &self,
        table: &str,
        name: Option<&str>,
        field: &str,
    ) -> Result<(IndexDef, bool), EngineError> {
        validate_field_name(field)?;
        let _ddl = self.ddl.lock().await;
        let table = self.table(table)?;
        let def = table.def();
        if let Some(existing) = def.index_on(field) {
            return Ok((existing.clone(), false));
        }
        let name = name.map_or_else(|| format!("{}_{field}_idx", def.name), str::to_string);
        if let Some(owner) =
            self.tables().iter().find(|table| table.def().indexes.iter().any(|index| index.name == name))
        {
            return Err(EngineError::InvalidDefinition(format!(
                "an index named {name:?} exists already (on table {})",
                owner.name()
            )));
        }
        let index = IndexDef { name, field: field.to_string() };
        let mut new_def = (*def).clone();
        new_def.indexes.push(index.clone());
        new_def.validate()?;
        self.catalog.append(&[catalog::table_record(&new_def)]).await?;
        table.add_index(new_def, &index);
        tracing::info!(table = %table.name(), index = %index.name, field, "index created");
        Ok((index, true))
    }

    /// Drops the index named `name`; returns the table it was on. On a cluster node the
    /// cluster drops it, on every node.
    pub async fn drop_index(&self, name: &str) -> Result<String, EngineError> {
        if self.is_replicated() {
            return self.drop_index_replicated(name).await;
        }
        self.drop_index_here(name).await
    }

    /// Drops an index on this node.
    pub(super) async fn drop_index_here(&self, name: &str) -> Result<String, EngineError> {
        let _ddl = self.ddl.lock().await;
        for table in self.tables() {
            let def = table.def();
            let Some(index) = def.indexes.iter().find(|index| index.name == name) else { continue };
            let mut new_def = (*def).clone();
            new_def.indexes.retain(|other| other.name != name);
            self.catalog.append(&[catalog::table_record(&new_def)]).await?;
            table.remove_index(new_def, &index.field);
            return Ok(table.name());
        }
        Err(EngineError::UnknownIndex(name.to_string()))
    }

    /// Drops the table `name` and deletes its rows. Its subscriptions end. On a cluster node
    /// the cluster drops it, on every node.
    pub async fn drop_table(&self, name: &str) -> Result<(), EngineError> {
        if self.is_replicated() {
            return self.drop_table_replicated(name).await;
        }
        self.drop_table_here(name).await
    }

    /// Drops a table on this node.
    pub(super) async fn drop_table_here(&self, name: &str) -> Result<(), EngineError> {
        let _ddl = self.ddl.lock().await;
        self.table(name)?;
        self.check_unread(name)?;
        self.catalog.append(&[catalog::drop_record(name, true)]).await?;
        self.tables.write().expect("tables lock").remove(name);
        self.catalog_changed();
        self.log.remove_topic(name)?;
        tracing::info!(table = name, "table dropped");
        Ok(())
    }
}
