//! Helpers shared by poot-formats' integration tests: where `../shared/models` is, and what its
//! absence means.
//!
//! A test never passes without running: where the folder is missing, [`shared_models`] panics
//! under `POOT_REQUIRE_SHARED=1` (CI), and otherwise records the skip in the file named by
//! `POOT_SKIP_LOG` (counted by `scripts/test_summary.py`) and on stderr.

use std::io::Write;
use std::path::PathBuf;

/// The shared real-model folder if it holds `stories260K`, else `None` with the skip recorded;
/// panics instead under `POOT_REQUIRE_SHARED=1`.
pub fn shared_models() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models");
    if dir.join("stories260K").is_dir() {
        return Some(dir);
    }
    let reason = format!("../shared missing: {} not found", dir.display());
    if std::env::var("POOT_REQUIRE_SHARED").as_deref() == Ok("1") {
        panic!("POOT_REQUIRE_SHARED=1 but {reason}");
    }
    record_skip(&reason);
    None
}

/// Appends `rust<TAB>poot-formats<TAB>test<TAB>reason` to `POOT_SKIP_LOG` (one write per line)
/// and prints it; libtest names each test's thread after the test.
pub fn record_skip(reason: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string();
    let line = format!("rust\tpoot-formats\t{test}\t{reason}\n");
    eprint!("SKIPPED: {line}");
    if let Some(path) = std::env::var_os("POOT_SKIP_LOG") {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .unwrap_or_else(|e| panic!("POOT_SKIP_LOG {path:?}: {e}"));
    }
}
