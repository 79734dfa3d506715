//! The Raft log on disk: what survives a reopen, what recovery cuts and what it refuses.

use std::fs::{self, OpenOptions};
use std::io::Write;

use bytes::Bytes;
use onehop_cluster::raftlog::{LogStore, OpenLogError, encode_frame};
use onehop_cluster::{Command, TypeConfig};
use openraft::storage::{RaftLogReader, RaftLogStorage};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

fn entry(term: u64, index: u64, text: &str) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(Command { term, body: Bytes::from(text.to_string()) }),
    }
}

fn texts(entries: &[Entry<TypeConfig>]) -> Vec<String> {
    entries
        .iter()
        .map(|entry| match &entry.payload {
            EntryPayload::Normal(command) => String::from_utf8(command.body.to_vec()).unwrap(),
            _ => "-".into(),
        })
        .collect()
}

async fn append(store: &mut LogStore, entries: Vec<Entry<TypeConfig>>) {
    store.append_durably(entries).await.unwrap();
}

fn segment(dir: &std::path::Path) -> std::path::PathBuf {
    fs::read_dir(dir)
        .unwrap()
        .map(|item| item.unwrap().path())
        .find(|path| path.to_string_lossy().ends_with(".log"))
        .unwrap()
}

#[tokio::test]
async fn appended_entries_survive_a_reopen_and_truncation_cuts_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    append(&mut store, (0..5).map(|i| entry(1, i, &format!("e{i}"))).collect()).await;
    append(&mut store, vec![entry(1, 5, "e5")]).await;
    drop(store);

    let mut store = LogStore::open(dir.path()).unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id.unwrap().index, 5);
    assert_eq!(texts(&store.try_get_log_entries(2..4).await.unwrap()), ["e2", "e3"]);

    store.truncate(LogId::new(CommittedLeaderId::new(1, 1), 3)).await.unwrap();
    assert_eq!(store.get_log_state().await.unwrap().last_log_id.unwrap().index, 2);
    append(&mut store, vec![entry(2, 3, "f3")]).await;
    drop(store);

    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(texts(&store.try_get_log_entries(0..10).await.unwrap()), ["e0", "e1", "e2", "f3"]);
    let last = store.get_log_state().await.unwrap().last_log_id.unwrap();
    assert_eq!((last.leader_id.term, last.index), (2, 3));
}

#[tokio::test]
async fn a_torn_tail_is_cut_and_the_entries_before_it_stay() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    append(&mut store, (0..3).map(|i| entry(1, i, &format!("e{i}"))).collect()).await;
    drop(store);
    // Half of a fourth entry's frame: the append a crash interrupted.
    let frame = encode_frame(&entry(1, 3, "torn"));
    OpenOptions::new().append(true).open(segment(dir.path())).unwrap().write_all(&frame[..frame.len() / 2]).unwrap();

    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(texts(&store.try_get_log_entries(0..10).await.unwrap()), ["e0", "e1", "e2"]);
    append(&mut store, vec![entry(1, 3, "e3")]).await;
    drop(store);
    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(texts(&store.try_get_log_entries(0..10).await.unwrap()), ["e0", "e1", "e2", "e3"]);
}

#[tokio::test]
async fn damage_before_valid_entries_is_refused_and_nothing_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    append(&mut store, (0..4).map(|i| entry(1, i, &format!("entry number {i}"))).collect()).await;
    drop(store);
    let path = segment(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    let len = bytes.len();
    // A flipped byte in the second entry's payload.
    let second = encode_frame(&entry(1, 0, "entry number 0")).len();
    bytes[second + 12] ^= 0x55;
    fs::write(&path, &bytes).unwrap();

    match LogStore::open(dir.path()) {
        Err(OpenLogError::Damaged { position, .. }) => assert_eq!(position, second as u64),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a damaged log with valid entries after the damage was opened"),
    }
    assert_eq!(fs::metadata(&path).unwrap().len(), len as u64, "the refused segment was changed");
}

#[tokio::test]
async fn purged_entries_are_gone_after_a_reopen_and_appends_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    append(&mut store, (0..4).map(|i| entry(1, i, &format!("e{i}"))).collect()).await;
    store.purge(LogId::new(CommittedLeaderId::new(1, 1), 1)).await.unwrap();
    assert_eq!(texts(&store.try_get_log_entries(0..10).await.unwrap()), ["e2", "e3"]);
    drop(store);
    let mut store = LogStore::open(dir.path()).unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.unwrap().index, 1);
    assert_eq!(texts(&store.try_get_log_entries(0..10).await.unwrap()), ["e2", "e3"]);
    append(&mut store, vec![entry(1, 4, "e4")]).await;
    assert_eq!(texts(&store.try_get_log_entries(0..10).await.unwrap()), ["e2", "e3", "e4"]);
}

#[tokio::test]
async fn a_purge_past_the_last_entry_empties_the_log_and_appends_go_on_after_it() {
    // What a node that installed a snapshot ahead of its log does (openraft purges to the
    // snapshot when it starts).
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    append(&mut store, (0..4).map(|i| entry(1, i, &format!("e{i}"))).collect()).await;
    store.purge(LogId::new(CommittedLeaderId::new(2, 1), 20)).await.unwrap();
    assert!(store.try_get_log_entries(0..30).await.unwrap().is_empty());
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id.unwrap().index, 20);
    append(&mut store, vec![entry(2, 21, "e21"), entry(2, 22, "e22")]).await;
    drop(store);
    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(texts(&store.try_get_log_entries(0..30).await.unwrap()), ["e21", "e22"]);
    assert_eq!(store.bounds(), Some((21, 22)));
    assert_eq!(store.get_log_state().await.unwrap().last_purged_log_id.unwrap().index, 20);
}
