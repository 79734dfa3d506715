//! Reading a transform's sources: one cursor per branch (a `UNION ALL` has several), taken
//! together as one feed, and the positions of all of them as one list of offsets.
//!
//! Positions travel as one `Vec<u64>` (in checkpoints and in the cluster's transform writes):
//! the first branch's offsets per partition, then, for each further branch, [`BRANCH_END`]
//! and that branch's. A transform with one branch has the list it always had.

use std::sync::Arc;

use futures_util::FutureExt;

use super::super::catchup::{Catchup, follow};
use super::SourcePosition;
use crate::error::EngineError;
use crate::hub::{Cursor, Delivery, Hub};
use crate::stream::Stream;

/// Ends one branch's offsets in a list of positions (no offset is this large).
const BRANCH_END: u64 = u64::MAX;

/// Each branch's positions as one list.
pub(crate) fn join_positions(branches: &[Vec<u64>]) -> Vec<u64> {
    let mut joined = Vec::with_capacity(branches.iter().map(|branch| branch.len() + 1).sum());
    for (index, branch) in branches.iter().enumerate() {
        if index > 0 {
            joined.push(BRANCH_END);
        }
        joined.extend_from_slice(branch);
    }
    joined
}

/// A list of positions as `count` branches' (missing branches have none yet).
pub(crate) fn split_positions(joined: &[u64], count: usize) -> Vec<Vec<u64>> {
    let mut branches: Vec<Vec<u64>> = joined.split(|offset| *offset == BRANCH_END).map(<[u64]>::to_vec).collect();
    branches.resize(count, Vec::new());
    branches
}

/// The cursors over a transform's branches' sources.
pub(crate) struct Reader {
    hub: Arc<Hub>,
    sources: Vec<Arc<Stream>>,
    cursors: Vec<Cursor>,
    catchup: Catchup,
    /// The branch [`Reader::ready`] asks first, so no branch starves the others.
    next_ready: usize,
}

impl Reader {
    /// Reads branch `i`'s source (`sources[i]`) from `positions[i]`.
    pub fn new(
        name: &str,
        hub: &Arc<Hub>,
        sources: &[Arc<Stream>],
        positions: Vec<Vec<u64>>,
    ) -> Result<Reader, EngineError> {
        let pairs: Vec<(&Stream, &[u64])> =
            sources.iter().zip(&positions).map(|(source, at)| (source.as_ref(), at.as_slice())).collect();
        let catchup = Catchup::of("transform", name, &pairs);
        let cursors =
            sources.iter().zip(positions).map(|(source, at)| follow(hub, source, at)).collect::<Result<_, _>>()?;
        Ok(Reader { hub: hub.clone(), sources: sources.to_vec(), cursors, catchup, next_ready: 0 })
    }

    /// Whether it is still replaying what the sources held when it started.
    pub fn restoring(&self) -> bool {
        !self.catchup.done()
    }

    /// The next delivery of any branch, and its branch. Cancel-safe, as [`Cursor::next`] is.
    pub async fn next(&mut self) -> Result<(usize, Delivery), EngineError> {
        if let [cursor] = self.cursors.as_mut_slice() {
            return Ok((0, cursor.next().await?));
        }
        let waiting = self
            .cursors
            .iter_mut()
            .enumerate()
            .map(|(branch, cursor)| Box::pin(async move { (branch, cursor.next().await) }));
        let ((branch, delivery), _, _) = futures_util::future::select_all(waiting).await;
        Ok((branch, delivery?))
    }

    /// A delivery that is ready now, if any branch has one (asking them in turn).
    pub fn ready(&mut self) -> Option<Result<(usize, Delivery), EngineError>> {
        let count = self.cursors.len();
        for step in 0..count {
            let branch = (self.next_ready + step) % count;
            if let Some(delivery) = self.cursors[branch].next().now_or_never() {
                self.next_ready = (branch + 1) % count;
                return Some(delivery.map(|delivery| (branch, delivery)));
            }
        }
        None
    }

    /// Branch `branch` fell behind the live feed: it reads on from the log at `positions`.
    pub fn refollow(&mut self, branch: usize, positions: Vec<u64>) -> Result<(), EngineError> {
        self.cursors[branch] = follow(&self.hub, &self.sources[branch], positions)?;
        Ok(())
    }

    /// Where it is in every branch, as one list ([`join_positions`]).
    pub fn positions(&self) -> Vec<u64> {
        if let [cursor] = self.cursors.as_slice() {
            return cursor.positions().to_vec();
        }
        let branches: Vec<Vec<u64>> = self.cursors.iter().map(|cursor| cursor.positions().to_vec()).collect();
        join_positions(&branches)
    }

    /// Whether the reader has read past the source record `position` names (or will never
    /// read it: a branch or partition it does not have).
    pub fn passed(&self, position: &SourcePosition) -> bool {
        let cursor = self.cursors.get(position.branch as usize);
        let next = cursor.and_then(|cursor| cursor.positions().get(position.partition as usize));
        next.is_none_or(|next| position.offset < *next)
    }

    /// Counts the replay on; true the one time it has read all the sources held at its start.
    pub fn caught_up(&mut self) -> bool {
        if self.catchup.done() {
            return false;
        }
        let positions: Vec<&[u64]> = self.cursors.iter().map(Cursor::positions).collect();
        self.catchup.update_all(&positions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_join_and_split_back() {
        let one = vec![vec![3, 0, 7]];
        assert_eq!(join_positions(&one), [3, 0, 7], "one branch: the list transforms always had");
        assert_eq!(split_positions(&[3, 0, 7], 1), one);
        let three = vec![vec![1, 2], vec![], vec![5]];
        let joined = join_positions(&three);
        assert_eq!(joined, [1, 2, BRANCH_END, BRANCH_END, 5]);
        assert_eq!(split_positions(&joined, 3), three);
        // A branch the list does not reach has no positions yet.
        assert_eq!(split_positions(&[4], 2), [vec![4], vec![]]);
    }
}
