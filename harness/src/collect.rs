//! Evidence from the nodes: every replica's final state for `replicas.jsonl`, and the nodes' log
//! files for `nodes/<node>/`, both through the database's optional abilities
//! ([`ReplicaDump`](crate::db::ReplicaDump), [`LogFiles`](crate::db::LogFiles)).

use std::collections::BTreeSet;

use crate::db::{Db, DumpedReplica};
use crate::remote;
use crate::runtime::Node;
use crate::store::RunDir;

/// Every replica on every node; a node whose state could not be read contributes one error
/// line per partition the other nodes hold.
pub fn dump_replicas(nodes: &[Node], db: &dyn Db) -> Vec<DumpedReplica> {
    let Some(dumper) = db.as_replica_dump() else {
        return Vec::new();
    };
    let results: Vec<(&Node, anyhow::Result<Vec<DumpedReplica>>)> =
        tokio::task::block_in_place(|| {
            std::thread::scope(|s| {
                let hs: Vec<_> = nodes
                    .iter()
                    .map(|n| s.spawn(move || (n, dumper.dump_replicas(n))))
                    .collect();
                hs.into_iter().filter_map(|h| h.join().ok()).collect()
            })
        });
    let mut partitions: BTreeSet<(String, i64)> = BTreeSet::new();
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for (node, r) in results {
        match r {
            Ok(rows) => {
                partitions.extend(
                    rows.iter()
                        .map(|r| (r.state.topic.clone(), r.state.partition)),
                );
                out.extend(rows);
            }
            Err(e) => failed.push((node, format!("{e:#}"))),
        }
    }
    for (node, error) in failed {
        for (topic, partition) in &partitions {
            out.push(DumpedReplica::unreadable(
                &node.cluster,
                &node.name,
                topic,
                *partition,
                error.clone(),
            ));
        }
    }
    out
}

/// Copies each node's log files into `nodes/<node>/`; a file that cannot be copied is noted in
/// `nodes/<node>/snarf-errors.txt`.
pub fn snarf_logs(nodes: &[Node], db: &dyn Db, run_dir: &RunDir) {
    let Some(logs) = db.as_log_files() else {
        return;
    };
    tokio::task::block_in_place(|| {
        for node in nodes {
            let Ok(dir) = run_dir.node_dir(&node.name) else {
                continue;
            };
            let mut errors = Vec::new();
            for path in logs.log_files(node) {
                let Some(file) = path.file_name() else {
                    continue;
                };
                let exists = remote::run(
                    node.remote.as_ref(),
                    &remote::command_line(&["test", "-f", &path.display().to_string()]),
                )
                .is_ok();
                if !exists {
                    continue;
                }
                if let Err(e) = node.remote.download(&path, &dir.join(file)) {
                    errors.push(e.to_string());
                }
            }
            if !errors.is_empty() {
                let _ = std::fs::write(dir.join("snarf-errors.txt"), errors.join("\n"));
            }
        }
    });
}

/// The last lines of a node's first log file, for error messages.
pub fn log_tail(node: &Node, db: &dyn Db) -> String {
    let Some(path) = db
        .as_log_files()
        .and_then(|l| l.log_files(node).into_iter().next())
    else {
        return String::new();
    };
    let cmd = remote::command_line(&["tail", "-n", "15", &path.display().to_string()]);
    match remote::run(node.remote.as_ref(), &cmd) {
        Ok(tail) if !tail.trim().is_empty() => {
            format!("\nlast lines of {}:\n{tail}", path.display())
        }
        _ => String::new(),
    }
}
