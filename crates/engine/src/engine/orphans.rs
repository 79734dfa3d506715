//! What the engine does at start with topics the catalog does not define: finish the drops
//! the catalog records, keep every other one as an orphan, and take an orphan back when it is
//! defined again.

use super::*;

impl Engine {
    /// Deletes the data of what the catalog says was dropped (a drop is acknowledged once its
    /// catalog record is durable, so one cut short by a crash is finished here), and keeps
    /// every other topic the catalog does not define as an orphan. Data is deleted only on
    /// the strength of a drop record, never because a definition is missing: a catalog that
    /// lost records (damage set aside with `--recover-catalog`, a deleted catalog directory)
    /// must not cost the data of the streams it forgot.
    pub(super) fn finish_drops_and_keep_orphans(&self, defs: &catalog::Definitions) -> Result<(), EngineError> {
        let mut orphans = BTreeSet::new();
        for topic in self.log.topics() {
            let (name, dropped, defined) = match topic.strip_prefix(OUTPUT_PREFIX) {
                Some(view) => (view, defs.dropped_views.contains(view), defs.views.contains_key(view)),
                None if topic.starts_with("__") => continue,
                None => (
                    topic.as_str(),
                    defs.dropped.contains(&topic),
                    defs.streams.contains_key(&topic) || defs.tables.contains_key(&topic),
                ),
            };
            if defined {
                continue;
            }
            if dropped {
                tracing::warn!(topic, name, "removing the data of a dropped stream, table or view");
                self.log.remove_topic(&topic)?;
            } else {
                tracing::error!(
                    topic,
                    "the catalog neither defines nor dropped this topic: its data is kept as an orphan; define \
                     it again to take it back"
                );
                orphans.insert(topic);
            }
        }
        metrics::gauge!("engine_orphaned_topics").set(orphans.len() as f64);
        *self.orphans.write().expect("orphans lock") = orphans;
        Ok(())
    }

    /// Topics whose data is on disk but that the catalog neither defines nor dropped (see
    /// [`Engine::open`]). Defining one again takes its data back.
    pub fn orphans(&self) -> Vec<String> {
        self.orphans.read().expect("orphans lock").iter().cloned().collect()
    }

    /// Checks that `topic`, if it is an orphan, can be taken back by a definition with
    /// `partitions` partitions (`compacted` for a table): its data on disk must fit.
    pub(super) fn check_adoption(
        &self,
        topic: &str,
        partitions: u32,
        compacted: bool,
        kind: &str,
    ) -> Result<(), EngineError> {
        if !self.orphans.read().expect("orphans lock").contains(topic) {
            return Ok(());
        }
        let found: Vec<Arc<Partition>> = self
            .log
            .partitions()
            .into_iter()
            .filter(|(name, _, _)| name == topic)
            .map(|(_, _, partition)| partition)
            .collect();
        let on_disk_compacted = found.first().is_some_and(|partition| partition.config().compacted);
        if found.len() as u32 != partitions || on_disk_compacted != compacted {
            let shape = if on_disk_compacted { "compacted data (a table's)" } else { "a stream's data" };
            return Err(EngineError::InvalidDefinition(format!(
                "{topic:?} has data on disk that the catalog lost (an orphan): {shape} in {} partition(s), which \
                 a {kind} with {partitions} partition(s) cannot take back. Define it to fit that data, or move \
                 {} aside to start it empty",
                found.len(),
                self.log.dir().join(topic).display()
            )));
        }
        Ok(())
    }

    /// Notes that the orphan `topic` (if it is one) has been defined again.
    pub(super) fn adopted(&self, topic: &str) {
        let mut orphans = self.orphans.write().expect("orphans lock");
        if orphans.remove(topic) {
            metrics::gauge!("engine_orphaned_topics").set(orphans.len() as f64);
            tracing::warn!(topic, "an orphaned topic was defined again: its data is taken back");
        }
    }
}
