//! Views and transforms: opening them from the catalog and their checkpoints, creating and
//! dropping them, and what they need of their sources.

use super::*;

/// Tombstones appended at once when a view's checkpoint records are deleted.
const TOMBSTONES_PER_APPEND: usize = 65_536;

impl Engine {
    /// Opens a defined view and starts it from its checkpoint (or, with none, from where its
    /// definition says).
    pub(super) fn open_view(&self, def: ViewDef, checkpoint: Option<Restored>) -> Result<Arc<View>, EngineError> {
        if let Some(join) = &def.join {
            let sources = self.join_sources(&def.name, join)?;
            let output = self.open_view_output(&def.name)?;
            let view = Arc::new(View::joined(def, sources, output));
            if tokio::runtime::Handle::try_current().is_ok() {
                view.start(self.hub.clone(), self.checkpointing(), Vec::new());
            } else {
                tracing::error!(view = view.name(), "views run inside the tokio runtime: this one is not started");
            }
            return Ok(view);
        }
        let table = self.table(&def.source).ok();
        let source = match &table {
            Some(table) => table.storage().clone(),
            None => self.stream(&def.source)?,
        };
        let output = self.open_view_output(&def.name)?;
        let late = def.late_stream.as_deref().and_then(|name| self.stream(name).ok());
        let restored = match checkpoint {
            // A view over a table starts from the table's rows.
            _ if table.is_some() => Restored::empty(vec![0]),
            Some(checkpoint) if checkpoint.positions.len() == source.partition_count() as usize => checkpoint,
            _ => {
                tracing::warn!(view = def.name, "no checkpoint: the view starts over from its source");
                Restored::empty(start_positions(&source, def.start))
            }
        };
        let positions = still_stored(&source, restored.positions.clone());
        let view = Arc::new(View::new(def, source, table, output, late, restored));
        if tokio::runtime::Handle::try_current().is_ok() {
            view.start(self.hub.clone(), self.checkpointing(), positions);
        } else {
            tracing::error!(view = view.name(), "views run inside the tokio runtime: this one is not started");
        }
        Ok(view)
    }

    /// The change stream of view `name`.
    fn open_view_output(&self, name: &str) -> Result<Arc<Stream>, EngineError> {
        let output_def = StreamDef {
            name: format!("{OUTPUT_PREFIX}{name}"),
            partitions: 1,
            retention_ms: None,
            retention_bytes: None,
            durability: Durability::Async,
            mqtt_topic: None,
            compacted: false,
        };
        let output_partition =
            self.log.open_partition(&output_def.name, 0, runtime::output_config(&self.options.stream_defaults))?;
        Ok(Arc::new(Stream::new(output_def, vec![output_partition], Default::default())))
    }

    /// The inputs of joined view `name`: each a table, a view without windows, or a stream (its
    /// newest record per key).
    fn join_sources(&self, name: &str, join: &JoinDef) -> Result<Vec<JoinSource>, EngineError> {
        join.validate().map_err(EngineError::InvalidDefinition)?;
        let mut sources = Vec::with_capacity(join.inputs.len());
        for input in &join.inputs {
            if input.source == name {
                return Err(EngineError::InvalidDefinition(format!("view {name} cannot read itself")));
            }
            let (source, id_field) = if let Ok(table) = self.table(&input.source) {
                let id_field = table.def().primary_key.clone();
                (JoinSource::Table(table), id_field)
            } else if let Ok(view) = self.view(&input.source) {
                let def = view.def();
                let id_field = if let Some(inner) = def.row_join() {
                    if !inner.keyed_by_driving_row() {
                        return Err(EngineError::InvalidDefinition(format!(
                            "view {:?} has a row per combination of its inputs' rows: a join reads views \
                             keyed by one row's id",
                            input.source
                        )));
                    }
                    inner.inputs[0].id_field.clone()
                } else if def.window != crate::view::Window::None {
                    return Err(EngineError::InvalidDefinition(format!(
                        "view {:?} has windows (several rows per key): a join reads tables and views \
                         without windows",
                        input.source
                    )));
                } else {
                    def.key_column().map(str::to_string).ok_or_else(|| {
                        EngineError::InvalidDefinition(format!(
                            "view {:?} does not select its GROUP BY key: a join finds its rows by it",
                            input.source
                        ))
                    })?
                };
                (JoinSource::View(view), id_field)
            } else if let Ok(stream) = self.stream(&input.source) {
                if !stream.def().compacted {
                    return Err(EngineError::InvalidDefinition(format!(
                        "{:?} is a stream of events (not compacted): a joined view reads compacted streams as \
                         tables of their newest record per key",
                        input.source
                    )));
                }
                (JoinSource::Stream(stream), crate::view::join::STREAM_KEY_COLUMN.to_string())
            } else {
                return Err(EngineError::UnknownTable(input.source.clone()));
            };
            if id_field != input.id_field {
                return Err(EngineError::InvalidDefinition(format!(
                    "{:?} is keyed by {id_field}, not {}",
                    input.source, input.id_field
                )));
            }
            sources.push(source);
        }
        Ok(sources)
    }

    pub fn view(&self, name: &str) -> Result<Arc<View>, EngineError> {
        self.views.read().expect("views lock").get(name).cloned().ok_or_else(|| EngineError::UnknownView(name.into()))
    }

    /// Every view, by name.
    pub fn views(&self) -> Vec<Arc<View>> {
        self.views.read().expect("views lock").values().cloned().collect()
    }

    /// Creates the view `def` describes and starts it: its definition and a first checkpoint
    /// (where it starts in its source) are durable before this returns. Creating a view that
    /// exists with the same definition returns it. On a cluster node the cluster creates it,
    /// and every node runs it over its own copy of the source.
    pub async fn create_view(&self, def: ViewDef) -> Result<Arc<View>, EngineError> {
        catalog::validate_name(&def.name)?;
        let longest = onehop_log::TOPIC_NAME_BYTES_MAX - runtime::OUTPUT_PREFIX.len();
        if def.name.len() > longest {
            return Err(EngineError::InvalidName {
                name: def.name.clone(),
                reason: format!(
                    "a view's name is at most {longest} characters: its changes are the stream {}{{name}}",
                    runtime::OUTPUT_PREFIX
                ),
            });
        }
        if let Some(join) = &def.join {
            self.join_sources(&def.name, join)?;
        }
        if def.aggregates_join() || (def.join.is_none() && self.table(&def.source).is_ok()) {
            check_over_table(&def)?;
        }
        if let Some(late) = &def.late_stream {
            if late == &def.source {
                return Err(EngineError::InvalidDefinition("late_stream cannot be the view's own source".into()));
            }
            if self.is_replicated() {
                // Every node would publish each late record there: once per node.
                return Err(EngineError::NotReplicated("a view's late_stream"));
            }
            // Created first (it takes the definition lock itself); harmless if the view is not.
            self.stream_or_create(late).await?;
        }
        if self.is_replicated() {
            return self.create_view_replicated(def).await;
        }
        self.create_view_here(def).await
    }

    /// Creates a view on this node (its `late_stream`, if any, exists).
    pub(super) async fn create_view_here(&self, def: ViewDef) -> Result<Arc<View>, EngineError> {
        catalog::validate_name(&def.name)?;
        if self.table(&def.source).is_ok() {
            check_over_table(&def)?;
        }
        let _ddl = self.ddl.lock().await;
        if let Ok(existing) = self.view(&def.name) {
            if existing.def() == &def {
                return Ok(existing);
            }
            return Err(EngineError::ViewExists { name: def.name.clone() });
        }
        if self.stream(&def.name).is_ok() {
            return Err(EngineError::NameTaken { name: def.name.clone(), kind: "stream" });
        }
        if self.table(&def.name).is_ok() {
            return Err(EngineError::NameTaken { name: def.name.clone(), kind: "table" });
        }
        if let Some(join) = &def.join {
            self.join_sources(&def.name, join)?;
        }
        let checkpoint = if def.join.is_some() || self.table(&def.source).is_ok() {
            None
        } else {
            let source = self.stream(&def.source)?;
            let checkpoint = Restored::empty(start_positions(&source, def.start));
            self.checkpoints.append(&[checkpoint.header(&def.name)]).await?;
            Some(checkpoint)
        };
        self.catalog.append(&[catalog::view_record(&def)]).await?;
        let name = def.name.clone();
        let view = self.open_view(def, checkpoint)?;
        self.adopted(&format!("{OUTPUT_PREFIX}{name}"));
        self.views.write().expect("views lock").insert(name.clone(), view.clone());
        self.catalog_changed();
        tracing::info!(view = name, source = view.def().source, "view created");
        Ok(view)
    }

    /// Drops the view `name`: stops it and deletes its changes and checkpoint. On a cluster
    /// node the cluster drops it, on every node.
    pub async fn drop_view(&self, name: &str) -> Result<(), EngineError> {
        if self.is_replicated() {
            return self.drop_view_replicated(name).await;
        }
        self.drop_view_here(name).await
    }

    /// Drops a view on this node.
    pub(super) async fn drop_view_here(&self, name: &str) -> Result<(), EngineError> {
        let _ddl = self.ddl.lock().await;
        let view = self.view(name)?;
        // A joined view reading it would lose an input.
        self.check_unread(name)?;
        self.catalog.append(&[catalog::drop_view_record(name)]).await?;
        self.views.write().expect("views lock").remove(name);
        self.catalog_changed();
        view.stop().await;
        // The header first: a drop cut short leaves strays, deleted at the next start.
        for tombstones in view.checkpoint_tombstones().chunks(TOMBSTONES_PER_APPEND) {
            self.checkpoints.append(tombstones).await?;
        }
        self.log.remove_topic(&format!("{OUTPUT_PREFIX}{name}"))?;
        tracing::info!(view = name, "view dropped");
        Ok(())
    }

    /// Deletes checkpoint records no view owns (see `checkpoint::strays`), in the background.
    pub(super) fn delete_stray_checkpoints(&self, strays: Vec<String>) {
        if strays.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        tracing::info!(records = strays.len(), "deleting view checkpoint records no view owns");
        let checkpoints = self.checkpoints.clone();
        runtime.spawn(async move {
            for chunk in strays.chunks(TOMBSTONES_PER_APPEND) {
                let tombstones: Vec<onehop_log::NewRecord> =
                    chunk.iter().map(|key| onehop_log::NewRecord::tombstone(key.clone())).collect();
                if let Err(error) = checkpoints.append(&tombstones).await {
                    tracing::warn!(%error, "stray view checkpoint records could not be deleted");
                    return;
                }
            }
        });
    }

    /// Stops every view and transform, each writing a last checkpoint (before the log closes).
    pub async fn stop_derived(&self) {
        for view in self.views() {
            view.stop().await;
        }
        for transform in self.transforms() {
            transform.stop().await;
        }
    }

    /// Refuses to drop `name` while a view or transform reads it.
    pub(super) fn check_unread(&self, name: &str) -> Result<(), EngineError> {
        let views = self.views.read().expect("views lock");
        if let Some(view) = views.values().find(|view| view.def().sources().contains(&name)) {
            return Err(EngineError::InUse {
                name: name.to_string(),
                reader: format!("view {:?}", view.name()),
                drop: format!("DROP VIEW {}", view.name()),
            });
        }
        drop(views);
        let transforms = self.transforms.read().expect("transforms lock");
        if let Some(transform) = transforms.values().find(|transform| transform.def().reads(name)) {
            return Err(EngineError::InUse {
                name: name.to_string(),
                reader: format!("transform {:?}", transform.name()),
                drop: format!("DROP STREAM {}", transform.name()),
            });
        }
        Ok(())
    }

    pub fn transform(&self, name: &str) -> Option<Arc<Transform>> {
        self.transforms.read().expect("transforms lock").get(name).cloned()
    }

    /// Every transform, by name.
    pub fn transforms(&self) -> Vec<Arc<Transform>> {
        self.transforms.read().expect("transforms lock").values().cloned().collect()
    }

    /// Opens a defined transform and starts it from its checkpoint (or, with none, from where
    /// its definition says, not writing again what its output already has from there).
    pub(super) fn open_transform(
        &self,
        def: TransformDef,
        checkpoint: Option<TransformCheckpoint>,
    ) -> Result<Arc<Transform>, EngineError> {
        let sources = def.branches().map(|branch| self.stream(&branch.source)).collect::<Result<Vec<_>, _>>()?;
        let tables = def
            .branches()
            .map(|branch| branch.lookups.iter().map(|lookup| self.table(&lookup.table)).collect())
            .collect::<Result<Vec<Vec<_>>, _>>()?;
        let output = self.stream(&def.name)?;
        let fits = |positions: &[u64]| {
            transform::split_positions(positions, sources.len())
                .iter()
                .zip(&sources)
                .all(|(positions, source)| positions.len() == source.partition_count() as usize)
        };
        let checkpoint = match checkpoint {
            Some(checkpoint)
                if fits(&checkpoint.positions) && checkpoint.output_ends.len() == output.partition_count() as usize =>
            {
                checkpoint
            }
            _ => {
                tracing::warn!(
                    transform = def.name,
                    "no checkpoint: the transform starts over, skipping what it wrote"
                );
                let positions: Vec<Vec<u64>> =
                    sources.iter().map(|source| start_positions(source, def.start)).collect();
                TransformCheckpoint::new(transform::join_positions(&positions), output.start_offsets())
            }
        };
        let transform = Arc::new(Transform::new(def, sources.clone(), tables, output, checkpoint.clone()));
        if let Some(replicator) = self.replicator.get() {
            // Runs where this node leads, from where the cluster's transform is.
            transform.start_replicated(self.hub.clone(), self.checkpointing(), replicator.clone(), self.leading());
        } else if self.options.cluster_node {
            // Started by `set_replicator`, which follows the open.
        } else if tokio::runtime::Handle::try_current().is_ok() {
            let positions: Vec<Vec<u64>> = transform
                .branch_positions(&checkpoint.positions)
                .into_iter()
                .zip(&sources)
                .map(|(positions, source)| still_stored(source, positions))
                .collect();
            let checkpoint = TransformCheckpoint::new(transform::join_positions(&positions), checkpoint.output_ends);
            transform.start(self.hub.clone(), self.checkpointing(), checkpoint);
        } else {
            tracing::error!(
                transform = transform.name(),
                "transforms run inside the tokio runtime: this one is not started"
            );
        }
        Ok(transform)
    }

    /// Creates the stream `output` and the transform `def` that feeds it from its source, and
    /// starts it. Both definitions and the transform's starting point are durable before this
    /// returns. Creating one that exists with the same definitions returns it.
    /// On a cluster node the cluster creates it; the leader runs it (docs/cluster.md).
    pub async fn create_transform(&self, def: TransformDef, output: StreamDef) -> Result<Arc<Transform>, EngineError> {
        output.validate()?;
        if output.name != def.name {
            return Err(EngineError::InvalidDefinition(format!(
                "the transform {:?} must write the stream of its name, not {:?}",
                def.name, output.name
            )));
        }
        if self.is_replicated() {
            return self.create_transform_replicated(def, output).await;
        }
        self.create_transform_here(def, output).await
    }

    /// Creates a transform and its output stream on this node; where it starts in its source
    /// is taken now (on a cluster node, where the creation applies: the same everywhere).
    pub(super) async fn create_transform_here(
        &self,
        def: TransformDef,
        output: StreamDef,
    ) -> Result<Arc<Transform>, EngineError> {
        let _ddl = self.ddl.lock().await;
        if let Some(existing) = self.transform(&def.name) {
            if existing.def() == &def && existing.output().def() == &output {
                return Ok(existing);
            }
            return Err(EngineError::StreamExists {
                name: def.name.clone(),
                existing: format!("computed by {}", existing.def().sql),
            });
        }
        self.check_new_stream(&output)?;
        def.check().map_err(EngineError::InvalidDefinition)?;
        let mut positions = Vec::new();
        for branch in def.branches() {
            if self.table(&branch.source).is_ok() {
                return Err(EngineError::InvalidDefinition(format!(
                    "{:?} is a table: a transform reads a stream (aggregate a table with CREATE VIEW)",
                    branch.source
                )));
            }
            positions.push(start_positions(&*self.stream(&branch.source)?, def.start));
            for lookup in &branch.lookups {
                self.table(&lookup.table)?;
            }
        }
        let checkpoint =
            TransformCheckpoint::new(transform::join_positions(&positions), vec![0; output.partitions as usize]);
        self.checkpoints.append(&[checkpoint.record(&def.name)]).await?;
        // One batch: the stream and the transform that writes it are defined together or not at all.
        self.catalog.append(&[catalog::stream_record(&output), catalog::transform_record(&def)]).await?;
        let stream = self.open_stream(output)?;
        self.adopted(stream.name());
        self.streams.write().expect("streams lock").insert(stream.name().to_string(), stream);
        self.streams_changed();
        let name = def.name.clone();
        let transform = self.open_transform(def, Some(checkpoint))?;
        self.transforms.write().expect("transforms lock").insert(name.clone(), transform.clone());
        tracing::info!(transform = name, sources = ?transform.def().sources(), "transform created");
        Ok(transform)
    }
}

/// Refuses what a view over a table cannot do: it aggregates the rows there are now, so time
/// (windows, event times, lateness, finals) and order (FIRST, LAST) do not apply.
fn check_over_table(def: &ViewDef) -> Result<(), EngineError> {
    let subject = match &def.join {
        Some(_) => "a view of joined inputs aggregates their current rows".to_string(),
        None => format!("{:?} is a table: a view over a table aggregates its current rows", def.source),
    };
    let refuse = |what: &str| {
        Err(EngineError::InvalidDefinition(format!("{subject}, so it takes no {what} (views over streams do)")))
    };
    if def.window != crate::view::Window::None {
        return refuse("window");
    }
    if def.event_time.is_some() {
        return refuse("event_time");
    }
    if def.late_stream.is_some() {
        return refuse("late_stream");
    }
    if def.emit_final || !def.emit_changes {
        return refuse("emit = 'final' (its rows change with every row change)");
    }
    let ordered = def.columns.iter().any(|column| {
        matches!(
            column,
            crate::view::Column::Aggregate {
                function: crate::view::AggregateKind::First | crate::view::AggregateKind::Last,
                ..
            }
        )
    });
    if ordered {
        return refuse("FIRST or LAST (rows have no order in time)");
    }
    Ok(())
}

/// `positions` in `source`, past what retention removed since they were taken (a view or
/// transform carries on from what is left).
fn still_stored(source: &Stream, positions: Vec<u64>) -> Vec<u64> {
    positions.iter().zip(source.start_offsets()).map(|(&at, start)| at.max(start)).collect()
}

/// Where a view or transform with no checkpoint starts in `source`.
fn start_positions(source: &Stream, start: Start) -> Vec<u64> {
    match start {
        Start::Earliest => source.start_offsets(),
        Start::Latest => source.end_offsets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::expr::{Expr, RecordField};
    use crate::view::{AggregateKind, Column, TransformBranch, Window};
    use std::time::Duration;

    /// Stopped before its task first ran (a drop right after the creation, on a busy runtime):
    /// the task still sees the stop, and the drop does not wait for it forever.
    #[tokio::test]
    async fn a_view_or_transform_stopped_before_its_task_first_runs_stops() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open_in(dir.path(), EngineOptions::default()).unwrap();
        engine.stream_or_create("in").await.unwrap();
        let view = engine
            .create_view(ViewDef {
                name: "counts".into(),
                source: "in".into(),
                window: Window::None,
                event_time: None,
                filter: None,
                key: Expr::Record { field: RecordField::Key },
                columns: vec![
                    Column::Key { name: "k".into() },
                    Column::Aggregate {
                        name: "n".into(),
                        function: AggregateKind::Count,
                        arg: None,
                        order_by: Vec::new(),
                    },
                ],
                grace_ms: 0,
                emit_changes: true,
                emit_final: false,
                retention_ms: crate::view::DEFAULT_RETENTION_MS,
                start: Start::Latest,
                late_stream: None,
                sql: String::new(),
                join: None,
            })
            .await
            .unwrap();
        // This runtime runs one task at a time, and the test has not yielded since the spawn.
        tokio::time::timeout(Duration::from_secs(60), view.stop()).await.expect("the view's task stopped");

        let branch = TransformBranch::all_of("in");
        let def = TransformDef {
            name: "out".into(),
            first: branch,
            union: Vec::new(),
            start: Start::Latest,
            value_format: Default::default(),
            sql: String::new(),
        };
        let transform = engine.create_transform(def, engine.default_stream_def("out")).await.unwrap();
        tokio::time::timeout(Duration::from_secs(60), transform.stop()).await.expect("the transform's task stopped");
    }
}
