//! Mutation test: the parsers survive every corruption of real checkpoint headers.
//!
//! For each real GGUF and safetensors file in `../shared/models`, thousands of deterministic
//! mutations (bit flips, 0x00/0xFF overwrites, random byte runs, truncations, count and length
//! fields set to huge or off-by-a-few values, JSON digits and punctuation changed) are parsed
//! with `parse_gguf` / `parse_safetensors` on the byte slice. Every case must return `Ok` or
//! `Err` without panicking; a watchdog thread fails the test on a hang (no case finished for
//! [`HANG_LIMIT`], a liveness guard far above any real case, which takes microseconds: it is
//! not a speed claim, and the slowest case is only reported). An `Ok` must still satisfy the parser's invariants (ranges inside the buffer, sizes
//! matching shape x dtype). Mutations stay within the header plus a little, since the data
//! region never affects parsing. A failure prints the file, case number and mutation, and every
//! case is reproducible from its printed seed.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use poot_formats::{parse_gguf, parse_safetensors, FormatError, TensorInfo};

/// Cases per file; with nine files, well over 10,000 in all.
const CASES_PER_FILE: u64 = 1_500;
/// With no progress for this long, the watchdog declares a hang (only an endless loop gets near
/// it, whatever the machine's load).
const HANG_LIMIT: Duration = Duration::from_secs(120);
const BASE_SEED: u64 = 0x5EED_0FB0_0FCA_FE00;

/// xorshift64*: small, deterministic, good enough to pick positions.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // Avoid the all-zero state and decorrelate nearby seeds.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> Option<&'a T> {
        xs.get(self.below(xs.len() as u64) as usize)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Gguf,
    Safetensors,
}

/// A file and the places in its header worth mutating.
struct Target {
    path: PathBuf,
    kind: Kind,
    bytes: Vec<u8>,
    /// Mutations land in `0..region`.
    region: usize,
    /// Offsets of little-endian u64 count/length/offset fields.
    u64_fields: Vec<usize>,
    /// Offsets of u64 fields that size later reads (counts, lengths, n_dims' dims).
    structural: Vec<usize>,
    /// Offsets of u32 fields (version, value types, n_dims, ggml types).
    u32_fields: Vec<usize>,
    /// (start, len) of digit runs in a JSON header.
    digit_runs: Vec<(usize, usize)>,
}

fn models_dir() -> Option<PathBuf> {
    common::shared_models()
}

fn files_with(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == ext))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Walks a valid GGUF header, recording field offsets.
struct Walker<'a> {
    b: &'a [u8],
    pos: usize,
    u64s: Vec<usize>,
    structural: Vec<usize>,
    u32s: Vec<usize>,
}

impl Walker<'_> {
    fn u32(&mut self) -> u32 {
        self.u32s.push(self.pos);
        let v = u32::from_le_bytes(self.b[self.pos..self.pos + 4].try_into().unwrap());
        self.pos += 4;
        v
    }
    fn u64(&mut self, structural: bool) -> u64 {
        self.u64s.push(self.pos);
        if structural {
            self.structural.push(self.pos);
        }
        let v = u64::from_le_bytes(self.b[self.pos..self.pos + 8].try_into().unwrap());
        self.pos += 8;
        v
    }
    fn string(&mut self) {
        let n = self.u64(true) as usize;
        self.pos += n;
    }
    fn value(&mut self, t: u32) {
        match t {
            0 | 1 | 7 => self.pos += 1,
            2 | 3 => self.pos += 2,
            4..=6 => self.pos += 4,
            10..=12 => self.pos += 8,
            8 => self.string(),
            9 => {
                let et = self.u32();
                let n = self.u64(true);
                for _ in 0..n {
                    self.value(et);
                }
            }
            other => panic!("valid file has value type {other}"),
        }
    }
    fn walk(&mut self) {
        self.pos = 4;
        self.u32();
        let nt = self.u64(true);
        let nkv = self.u64(true);
        for _ in 0..nkv {
            self.string();
            let t = self.u32();
            self.value(t);
        }
        for _ in 0..nt {
            self.string();
            let nd = self.u32();
            for _ in 0..nd {
                self.u64(true);
            }
            self.u32();
            self.u64(false);
        }
    }
}

fn load(path: PathBuf, kind: Kind) -> Target {
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut t = Target {
        path,
        kind,
        region: 0,
        u64_fields: Vec::new(),
        structural: Vec::new(),
        u32_fields: Vec::new(),
        digit_runs: Vec::new(),
        bytes,
    };
    let header_end = match kind {
        Kind::Gguf => {
            let h = parse_gguf(&t.path, &t.bytes)
                .unwrap_or_else(|e| panic!("the original must parse: {e}"));
            let mut w = Walker {
                b: &t.bytes,
                pos: 0,
                u64s: Vec::new(),
                structural: Vec::new(),
                u32s: Vec::new(),
            };
            w.walk();
            (t.u64_fields, t.structural, t.u32_fields) = (w.u64s, w.structural, w.u32s);
            h.data_offset() as usize
        }
        Kind::Safetensors => {
            let h = parse_safetensors(&t.path, &t.bytes)
                .unwrap_or_else(|e| panic!("the original must parse: {e}"));
            t.u64_fields.push(0);
            t.structural.push(0);
            let end = h.data_offset() as usize;
            let mut i = 8;
            while i < end {
                if t.bytes[i].is_ascii_digit() {
                    let start = i;
                    while i < end && t.bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                    t.digit_runs.push((start, i - start));
                } else {
                    i += 1;
                }
            }
            end
        }
    };
    t.region = header_end.saturating_add(64).min(t.bytes.len());
    t
}

/// Applies one mutation in place; returns the bytes to restore, the slice length to parse, and
/// a description.
fn mutate(t: &mut Target, rng: &mut Rng) -> (Vec<(usize, u8)>, usize, String) {
    let mut undo = Vec::new();
    let mut len = t.bytes.len();
    let region = t.region as u64;
    let b = &mut t.bytes;
    let set = |b: &mut Vec<u8>, at: usize, v: u8, undo: &mut Vec<(usize, u8)>| {
        if at < b.len() {
            undo.push((at, b[at]));
            b[at] = v;
        }
    };
    let choice = rng.below(10);
    let desc = match choice {
        0 | 1 => {
            let at = rng.below(region) as usize;
            let bit = rng.below(8);
            let v = b[at] ^ (1 << bit);
            set(b, at, v, &mut undo);
            format!("flip bit {bit} of byte {at}")
        }
        2 => {
            let at = rng.below(region) as usize;
            let v = if rng.below(2) == 0 { 0x00 } else { 0xFF };
            set(b, at, v, &mut undo);
            format!("byte {at} = {v:#04x}")
        }
        3 => {
            let at = rng.below(region) as usize;
            let n = 1 + rng.below(8) as usize;
            for i in 0..n {
                let v = rng.next() as u8;
                set(b, at + i, v, &mut undo);
            }
            format!("{n} random bytes at {at}")
        }
        4 => {
            // Truncate anywhere: in the header most of the time, in the data sometimes.
            len = if rng.below(4) == 0 {
                rng.below(b.len() as u64)
            } else {
                rng.below(region)
            } as usize;
            format!("truncate to {len}")
        }
        5..=7 => {
            let fields = if rng.below(3) == 0 {
                &t.u64_fields
            } else {
                &t.structural
            };
            let Some(&at) = rng.pick(fields) else {
                return (undo, len, "no-op".into());
            };
            let orig = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
            let remaining = (b.len() - at) as u64;
            let v = match rng.below(12) {
                0 => u64::MAX,
                1 => u64::MAX / 2,
                2 => 1 << 32,
                3 => 1 << 62,
                4 => i64::MAX as u64,
                5 => orig.wrapping_add(1 + rng.below(3)),
                6 => orig.wrapping_sub(1 + rng.below(3)),
                7 => orig.wrapping_mul(2),
                8 => 0,
                9 => remaining,
                10 => remaining / 8 + rng.below(4),
                _ => rng.next(),
            };
            for (i, byte) in v.to_le_bytes().into_iter().enumerate() {
                set(b, at + i, byte, &mut undo);
            }
            format!("u64 at {at}: {orig} -> {v}")
        }
        8 if t.kind == Kind::Gguf => {
            let Some(&at) = rng.pick(&t.u32_fields) else {
                return (undo, len, "no-op".into());
            };
            let orig = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
            let v = match rng.below(4) {
                0 => rng.below(40) as u32,
                1 => u32::MAX,
                2 => orig.wrapping_add(1),
                _ => orig ^ (1 << rng.below(32)),
            };
            for (i, byte) in v.to_le_bytes().into_iter().enumerate() {
                set(b, at + i, byte, &mut undo);
            }
            format!("u32 at {at}: {orig} -> {v}")
        }
        _ if t.kind == Kind::Safetensors && rng.below(2) == 0 => {
            let Some(&(at, n)) = rng.pick(&t.digit_runs) else {
                return (undo, len, "no-op".into());
            };
            let how = rng.below(3);
            for i in 0..n {
                let v = match how {
                    0 => b'9',
                    1 => b'0' + rng.below(10) as u8,
                    _ if i == 0 => b'0' + rng.below(10) as u8,
                    _ => b[at + i],
                };
                set(b, at + i, v, &mut undo);
            }
            format!("digits at {at}..{} ({how})", at + n)
        }
        _ => {
            let at = rng.below(region) as usize;
            let v = *rng.pick(b"{}[]\",:-.e\\ \x00\x80").unwrap_or(&0);
            set(b, at, v, &mut undo);
            format!("byte {at} = {v:?}")
        }
    };
    (undo, len, desc)
}

/// Checks what an `Ok` parse promises.
fn check_ok(tensors: &[TensorInfo], len: usize) -> Result<(), String> {
    for t in tensors {
        let end = t
            .offset
            .checked_add(t.nbytes)
            .ok_or("offset + nbytes overflows")?;
        if end > len as u64 {
            return Err(format!("tensor {} ends at {end}, past {len}", t.name));
        }
        if t.dtype.bytes_for(t.n_elements()) != Some(t.nbytes) {
            return Err(format!(
                "tensor {}: nbytes {} does not match shape x dtype",
                t.name, t.nbytes
            ));
        }
    }
    Ok(())
}

fn parse(kind: Kind, path: &Path, b: &[u8]) -> Result<Result<(), String>, FormatError> {
    match kind {
        Kind::Gguf => parse_gguf(path, b).map(|h| check_ok(h.tensors(), b.len())),
        Kind::Safetensors => parse_safetensors(path, b).map(|h| check_ok(h.tensors(), b.len())),
    }
}

#[test]
fn mutated_headers_never_panic_hang_or_lie() {
    let Some(dir) = models_dir() else { return };
    let mut targets = Vec::new();
    for sub in ["stories260K", "vocab", "quant-slices"] {
        targets.extend(
            files_with(&dir.join(sub), "gguf")
                .into_iter()
                .map(|p| (p, Kind::Gguf)),
        );
    }
    for sub in ["stories260K/hf", "quant-slices"] {
        targets.extend(
            files_with(&dir.join(sub), "safetensors")
                .into_iter()
                .map(|p| (p, Kind::Safetensors)),
        );
    }
    assert!(
        targets.len() >= 9,
        "expected at least 9 real files, found {targets:?}"
    );

    // The watchdog: the worker bumps `progress` per case; no bump for HANG_LIMIT is a hang.
    let progress = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let (p2, d2) = (progress.clone(), done.clone());
    let worker = std::thread::spawn(move || run_cases(targets, &p2, &d2));
    let mut last = (0, Instant::now());
    while done.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(50));
        let p = progress.load(Ordering::SeqCst);
        if p != last.0 {
            last = (p, Instant::now());
        } else if last.1.elapsed() > HANG_LIMIT {
            panic!("hang: case {p} made no progress for {HANG_LIMIT:?}");
        }
    }
    let report = worker.join().expect("the worker catches every panic");
    println!("{}", report.summary);
    assert!(report.cases >= 10_000, "only {} cases ran", report.cases);
    assert!(
        report.failures.is_empty(),
        "{} failing cases:\n{}",
        report.failures.len(),
        report.failures.join("\n")
    );
}

struct Report {
    cases: u64,
    failures: Vec<String>,
    summary: String,
}

fn run_cases(targets: Vec<(PathBuf, Kind)>, progress: &AtomicU64, done: &AtomicU64) -> Report {
    // Keep panic messages from flooding the output; the failures list says what happened.
    std::panic::set_hook(Box::new(|_| {}));
    let mut failures = Vec::new();
    let mut summary = String::new();
    let mut cases = 0u64;
    let started = Instant::now();
    for (fi, (path, kind)) in targets.into_iter().enumerate() {
        let mut t = load(path, kind);
        let (mut ok, mut kinds) = (0u64, std::collections::BTreeMap::<&'static str, u64>::new());
        let mut slowest = Duration::ZERO;
        for case in 0..CASES_PER_FILE {
            let seed = BASE_SEED ^ ((fi as u64) << 32) ^ case;
            let mut rng = Rng::new(seed);
            let (undo, len, desc) = mutate(&mut t, &mut rng);
            progress.fetch_add(1, Ordering::SeqCst);
            let t0 = Instant::now();
            let r = catch_unwind(AssertUnwindSafe(|| parse(t.kind, &t.path, &t.bytes[..len])));
            let dt = t0.elapsed();
            slowest = slowest.max(dt);
            let name = t
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let fail = |why: String| format!("{name} case {case} (seed {seed:#x}, {desc}): {why}");
            match r {
                Err(p) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                    failures.push(fail(format!("panicked: {}", msg.unwrap_or_default())));
                }
                Ok(Ok(Err(broken))) => failures.push(fail(format!("Ok but {broken}"))),
                Ok(Ok(Ok(()))) => ok += 1,
                Ok(Err(e)) => {
                    if e.file() != t.path {
                        failures.push(fail(format!(
                            "error names {} instead of the file: {e}",
                            e.file().display()
                        )));
                    }
                    *kinds.entry(e.kind()).or_default() += 1;
                }
            }
            for (at, v) in undo.into_iter().rev() {
                t.bytes[at] = v;
            }
            cases += 1;
        }
        // Restoring must give back the original.
        if let Ok(Err(e)) = catch_unwind(AssertUnwindSafe(|| parse(t.kind, &t.path, &t.bytes))) {
            failures.push(format!(
                "{}: the restored original no longer parses: {e}",
                t.path.display()
            ));
        }
        summary.push_str(&format!(
            "{}: {CASES_PER_FILE} cases, {ok} ok, slowest {slowest:?}, errors {kinds:?}\n",
            t.path.display()
        ));
    }
    let _ = std::panic::take_hook();
    summary.push_str(&format!("{cases} cases in {:?}", started.elapsed()));
    done.store(1, Ordering::SeqCst);
    Report {
        cases,
        failures,
        summary,
    }
}
