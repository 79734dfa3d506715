//! The Raft log on disk: what survives a reopen, what recovery cuts and what it refuses.

use std::fs::{self, OpenOptions};
use std::io::Write;

use bytes::Bytes;
use onehop_cluster::raftlog::{FORMAT, LogStore, OpenLogError, SEGMENT_HEADER_BYTES, UNNUMBERED_BODY, encode_frame};
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
    let second = SEGMENT_HEADER_BYTES + encode_frame(&entry(1, 0, "entry number 0")).len();
    bytes[second + 12] ^= 0x55;
    fs::write(&path, &bytes).unwrap();

    match LogStore::open(dir.path()) {
        Err(error @ OpenLogError::Damaged { position, .. }) => {
            assert_eq!(position, second as u64);
            let message = error.to_string();
            assert!(message.contains(&path.display().to_string()) && message.contains("What to do"), "{message}");
        }
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

#[tokio::test]
async fn a_segment_from_before_format_numbers_is_read_and_appends_go_to_a_new_one() {
    // Format 0: frames from byte 0, command bodies with no format byte of their own.
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join(format!("segment-{:020}.log", 0));
    let frames: Vec<u8> = (0..3).flat_map(|i| encode_frame(&entry(1, i, &format!("e{i}")))).collect();
    fs::write(&old, &frames).unwrap();
    let numbered = |text: &str| format!("{}{text}", char::from(UNNUMBERED_BODY));

    let mut store = LogStore::open(dir.path()).unwrap();
    let read = texts(&store.try_get_log_entries(0..10).await.unwrap());
    assert_eq!(read, [numbered("e0"), numbered("e1"), numbered("e2")], "bodies get the unnumbered format byte");
    append(&mut store, vec![entry(1, 3, "e3")]).await;
    drop(store);
    assert_eq!(fs::read(&old).unwrap(), frames, "an old segment is never appended to");
    let new = fs::read(dir.path().join(format!("segment-{:020}.log", 3))).unwrap();
    assert_eq!(&new[..4], b"OHRL");
    assert_eq!(u16::from_le_bytes([new[4], new[5]]), FORMAT);

    let mut store = LogStore::open(dir.path()).unwrap();
    let read = texts(&store.try_get_log_entries(0..10).await.unwrap());
    assert_eq!(read, [numbered("e0"), numbered("e1"), numbered("e2"), "e3".to_string()]);
}

#[tokio::test]
async fn a_newer_format_and_an_unreadable_vote_are_refused_naming_the_file_and_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    append(&mut store, (0..2).map(|i| entry(1, i, &format!("e{i}"))).collect()).await;
    store.save_vote(&openraft::Vote::new(3, 1)).await.unwrap();
    drop(store);

    let vote = dir.path().join("vote");
    let kept = fs::read(&vote).unwrap();
    fs::write(&vote, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff").unwrap();
    let message = LogStore::open(dir.path()).err().expect("an unreadable vote is refused").to_string();
    assert!(message.contains(&vote.display().to_string()) && message.contains("vote"), "{message}");
    assert!(message.contains("What to do") && !message.contains("valid entries follow"), "{message}");
    fs::write(&vote, kept).unwrap();

    let path = segment(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    bytes[4..6].copy_from_slice(&(FORMAT + 1).to_le_bytes());
    fs::write(&path, &bytes).unwrap();
    match LogStore::open(dir.path()) {
        Err(error @ OpenLogError::NewerFormat { .. }) => {
            let message = error.to_string();
            assert!(message.contains(&path.display().to_string()) && message.contains("newer onehop"), "{message}");
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a segment of a newer format was opened"),
    }
}

#[tokio::test]
async fn a_newest_segment_whose_header_a_crash_cut_short_holds_nothing_and_goes() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    append(&mut store, (0..2).map(|i| entry(1, i, &format!("e{i}"))).collect()).await;
    drop(store);
    let torn = dir.path().join(format!("segment-{:020}.log", 2));
    fs::write(&torn, b"OHR").unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    assert!(!torn.exists());
    append(&mut store, vec![entry(1, 2, "e2")]).await;
    drop(store);
    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(texts(&store.try_get_log_entries(0..10).await.unwrap()), ["e0", "e1", "e2"]);
}
