//! Property test of the log: random appends, truncations, flushes and crashes (a segment file
//! holding unflushed data, rolled or active, cut at a random byte past what was flushed) never
//! lose a flushed batch and never serve a corrupt one.

use proptest::prelude::*;
use tidemark_broker::log::testing::{batch, values};
use tidemark_broker::log::{LogSettings, PartitionLog};

#[derive(Clone, Debug)]
enum Step {
    Append(u8),
    Flush,
    Truncate(u8),
    /// Which segment holding unflushed data is torn, and where past the flushed data.
    Crash(u8, u16),
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (1u8..4).prop_map(Step::Append),
        2 => Just(Step::Flush),
        1 => any::<u8>().prop_map(Step::Truncate),
        2 => (any::<u8>(), any::<u16>()).prop_map(|(s, cut)| Step::Crash(s, cut)),
        1 => Just(Step::Reopen),
    ]
}

fn segment_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    v.sort();
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn flushed_batches_survive_crashes(steps in proptest::collection::vec(step(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let settings = LogSettings { segment_bytes: 600, flush_interval_messages: u64::MAX, max_batch_bytes: u64::MAX };
        let (mut log, _) = PartitionLog::open(dir.path(), settings).unwrap();
        // The model: every value in the log, and how many of them are known flushed.
        let mut model: Vec<Vec<u8>> = Vec::new();
        let mut flushed = 0usize;
        let mut counter = 0u32;
        for s in steps {
            match s {
                Step::Append(n) => {
                    let vals: Vec<Vec<u8>> = (0..n).map(|_| { counter += 1; format!("value-{counter}").into_bytes() }).collect();
                    let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
                    let info = log.append_as_leader(&batch(&refs), 1).unwrap();
                    prop_assert_eq!(info.first_offset as usize, model.len());
                    model.extend(vals);
                }
                Step::Flush => {
                    log.flush();
                    flushed = model.len();
                }
                Step::Truncate(at) => {
                    let target = (at as usize) % (model.len() + 1);
                    log.truncate_to(target as i64).unwrap();
                    let end = log.log_end_offset() as usize;
                    prop_assert!(end <= target);
                    model.truncate(end);
                    // Truncation is synchronous; what remains stays flushed.
                    flushed = end;
                }
                Step::Crash(which, cut) => {
                    let headers = log.batch_headers().unwrap();
                    // Each segment's file and where flushed data ends in it. A rolled segment is
                    // flushed in the background, so it is as exposed as the active one until a
                    // flush; a crash may tear any file past its flushed bytes.
                    let exposed: Vec<(std::path::PathBuf, u64, u64)> = segment_files(dir.path())
                        .into_iter()
                        .map(|file| {
                            let base: i64 = file.file_stem().unwrap().to_str().unwrap().parse().unwrap();
                            let len = std::fs::metadata(&file).unwrap().len();
                            let flushed_end = headers
                                .iter()
                                .filter(|(_, b, _)| *b == base)
                                .find(|(_, _, h)| h.base_offset >= flushed as i64)
                                .map_or(len, |(pos, _, _)| *pos);
                            (file, flushed_end, len)
                        })
                        .filter(|(_, flushed_end, len)| flushed_end < len)
                        .collect();
                    drop(log);
                    if !exposed.is_empty() {
                        let (file, min, len) = &exposed[which as usize % exposed.len()];
                        let new_len = min + (cut as u64) % (len - min + 1);
                        std::fs::OpenOptions::new().write(true).open(file).unwrap().set_len(new_len).unwrap();
                    }
                    let (reopened, _) = PartitionLog::open(dir.path(), settings).unwrap();
                    log = reopened;
                    let end = log.log_end_offset() as usize;
                    prop_assert!(end >= flushed, "lost flushed data: end {} < flushed {}", end, flushed);
                    model.truncate(end);
                    flushed = end;
                }
                Step::Reopen => {
                    log.close().unwrap();
                    let (reopened, notes) = PartitionLog::open(dir.path(), settings).unwrap();
                    prop_assert!(notes.is_empty());
                    log = reopened;
                    flushed = model.len();
                }
            }
            prop_assert_eq!(log.log_end_offset() as usize, model.len());
        }
        let read = values(&log.read(0, i64::MAX, usize::MAX).unwrap().records);
        let got: Vec<Vec<u8>> = read.iter().map(|(_, v, _)| v.clone()).collect();
        prop_assert_eq!(got, model);
        prop_assert!(read.iter().enumerate().all(|(i, (o, _, _))| *o == i as i64));
    }
}
