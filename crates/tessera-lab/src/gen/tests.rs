use super::*;
use std::collections::{HashMap, HashSet};
use tessera::chunker::{cut_all, FastCdc};
use tessera::FingerprintAlgo;

fn small(seed: u64) -> GenOptions {
    GenOptions {
        versions: 4,
        size: 2 << 20,
        seed,
        ..GenOptions::default()
    }
}

/// Every version of `opts` as archive bytes (or trace text), in stream order.
fn versions(opts: &GenOptions) -> Vec<(VersionInfo, Vec<u8>)> {
    let mut ds = Dataset::new(opts).unwrap();
    let mut out = Vec::new();
    while let Some((info, l)) = ds.next_version() {
        let mut buf = Vec::new();
        if opts.trace {
            l.write_trace(&mut buf).unwrap();
        } else {
            let n = l.write_tar(&mut buf).unwrap();
            assert_eq!(n, buf.len() as u64);
        }
        out.push((info, buf));
    }
    out
}

#[test]
fn same_seed_same_bytes_different_seed_differs() {
    let a = versions(&small(7));
    let b = versions(&small(7));
    let c = versions(&small(8));
    assert_eq!(a.len(), 4);
    for i in 0..4 {
        assert!(a[i].1 == b[i].1, "version {i} differs for the same seed");
        assert!(a[i].1 != c[i].1, "version {i} same for different seeds");
    }
}

#[test]
fn archives_are_valid_ustar() {
    let opts = small(3);
    let mut ds = Dataset::new(&opts).unwrap();
    while let Some((info, l)) = ds.next_version() {
        let mut buf = Vec::new();
        l.write_tar(&mut buf).unwrap();
        let entries = parse_tar(&buf).unwrap();
        let files: Vec<&TarEntry> = entries.iter().filter(|e| e.typeflag == b'0').collect();
        assert_eq!(files.len(), l.file_count(), "{}", info.file_name);
        let sum: u64 = files.iter().map(|e| e.size).sum();
        assert_eq!(sum, l.logical_bytes());
        let paths: HashSet<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths.len(), entries.len(), "duplicate paths");
        // Directories precede their contents.
        let mut seen_dirs = HashSet::new();
        for e in &entries {
            let parent = match e.path.trim_end_matches('/').rfind('/') {
                Some(i) => &e.path[..=i],
                None => "",
            };
            assert!(
                parent.is_empty() || seen_dirs.contains(parent),
                "{}",
                e.path
            );
            if e.typeflag == b'5' {
                seen_dirs.insert(e.path.clone());
            }
        }
        let size = l.logical_bytes() as f64;
        assert!(
            size > opts.size as f64 * 0.9 && size < opts.size as f64 * 1.5,
            "{size}"
        );
    }
}

#[test]
fn tar_lists_the_archive() {
    if std::process::Command::new("tar")
        .arg("--version")
        .output()
        .is_err()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let opts = GenOptions {
        versions: 2,
        size: 1 << 20,
        ..GenOptions::default()
    };
    let summary = generate(dir.path(), &opts).unwrap();
    for v in &summary.versions {
        let out = std::process::Command::new("tar")
            .arg("tvf")
            .arg(&v.path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listing = String::from_utf8(out.stdout).unwrap();
        let files = listing.lines().filter(|l| l.starts_with('-')).count();
        assert_eq!(files, v.files);
        let data = std::fs::read(&v.path).unwrap();
        assert_eq!(data.len() as u64, v.bytes);
    }
}

/// Per file path: (size, mtime).
fn listing(buf: &[u8]) -> HashMap<String, (u64, u64)> {
    parse_tar(buf)
        .unwrap()
        .into_iter()
        .filter(|e| e.typeflag == b'0')
        .map(|e| (e.path, (e.size, e.mtime)))
        .collect()
}

/// Fraction of last version's files that changed (content, mtime, or gone).
fn changed_fraction(opts: &GenOptions) -> f64 {
    let vs = versions(opts);
    let mut fracs = Vec::new();
    for w in vs.windows(2) {
        let (a, b) = (listing(&w[0].1), listing(&w[1].1));
        let changed = a.iter().filter(|(p, m)| b.get(*p) != Some(m)).count();
        fracs.push(changed as f64 / a.len() as f64);
    }
    fracs.iter().sum::<f64>() / fracs.len() as f64
}

#[test]
fn versions_evolve_with_the_change_rate() {
    let mut o = small(11);
    o.versions = 5;
    o.touch_rate = 0.0;
    o.change_rate = 0.0;
    assert_eq!(changed_fraction(&o), 0.0);
    o.change_rate = 0.05;
    let low = changed_fraction(&o);
    o.change_rate = 0.2;
    let high = changed_fraction(&o);
    // Modified + deleted + renamed ≈ 1.15 × the change rate.
    assert!((0.03..0.09).contains(&low), "{low}");
    assert!((0.15..0.30).contains(&high), "{high}");
}

#[test]
fn multi_source_manifest_interleaves() {
    let dir = tempfile::tempdir().unwrap();
    let opts = GenOptions {
        versions: 2,
        size: 256 << 10,
        sources: 3,
        ..GenOptions::default()
    };
    let summary = generate(dir.path(), &opts).unwrap();
    assert_eq!(summary.versions.len(), 6);
    let text = std::fs::read_to_string(dir.path().join(MANIFEST)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "version_file\tsource\tsource_version\tbytes\tlogical_bytes\tfiles"
    );
    let rows: Vec<Vec<&str>> = lines[1..].iter().map(|l| l.split('\t').collect()).collect();
    let expect = [
        ("v0001.tar", "syn1", "1"),
        ("v0002.tar", "syn2", "1"),
        ("v0003.tar", "syn3", "1"),
        ("v0004.tar", "syn1", "2"),
        ("v0005.tar", "syn2", "2"),
        ("v0006.tar", "syn3", "2"),
    ];
    for (row, (f, s, v)) in rows.iter().zip(expect) {
        assert_eq!((row[0], row[1], row[2]), (f, s, v));
        let len = std::fs::metadata(dir.path().join(f)).unwrap().len();
        assert_eq!(row[3], len.to_string());
        // Each lineage's tree lives under its own root directory.
        let data = std::fs::read(dir.path().join(f)).unwrap();
        assert!(parse_tar(&data)
            .unwrap()
            .iter()
            .all(|e| e.path.starts_with(&format!("{s}/"))));
    }
    // Lineages are different trees.
    let a = std::fs::read(dir.path().join("v0001.tar")).unwrap();
    let b = std::fs::read(dir.path().join("v0002.tar")).unwrap();
    assert!(a[512..4096] != b[512..4096]);
    let single = generate(
        dir.path().join("one").as_path(),
        &GenOptions {
            versions: 1,
            size: 64 << 10,
            ..GenOptions::default()
        },
    )
    .unwrap();
    let text = std::fs::read_to_string(&single.manifest).unwrap();
    assert!(text
        .lines()
        .nth(1)
        .unwrap()
        .starts_with("v0001.tar\tsyn\t1\t"));
}

#[test]
fn trace_mode_sizes_and_format() {
    let opts = GenOptions {
        versions: 3,
        size: 16 << 20,
        trace: true,
        ..GenOptions::default()
    };
    let vs = versions(&opts);
    assert!(vs == versions(&opts), "trace not deterministic");
    for (info, text) in &vs {
        assert!(info.file_name.ends_with(".trace"));
        let mut r = crate::trace::DestorReader::new(&text[..], info.file_name.clone());
        let (mut n, mut bytes) = (0u64, 0u64);
        while let Some(c) = r.next_chunk().unwrap() {
            assert_eq!(c.fp_len, 20);
            assert!(c.size >= 1 && c.size <= opts.chunk.max);
            n += 1;
            bytes += u64::from(c.size);
        }
        let target = opts.size as f64;
        assert!(
            (bytes as f64) > target * 0.9 && (bytes as f64) < target * 1.5,
            "{bytes}"
        );
        let mean = bytes as f64 / n as f64;
        // Per-file chunking: small files are single short chunks.
        assert!(mean > 3000.0 && mean < 9000.0, "mean chunk {mean}");
    }
    // The streaming API gives the same chunks as the written trace.
    let mut ds = Dataset::new(&opts).unwrap();
    let (_, l) = ds.next_version().unwrap();
    let logical: u64 = l
        .chunks()
        .unwrap()
        .filter_map(|e| match e {
            TraceEvent::Chunk(c) => Some(u64::from(c.size)),
            _ => None,
        })
        .sum();
    assert_eq!(logical, l.logical_bytes());
    assert!(l.write_tar(&mut Vec::new()).is_err());
}

#[test]
fn invalid_options_are_rejected() {
    let base = GenOptions::default();
    let cases = [
        GenOptions {
            versions: 0,
            ..base.clone()
        },
        GenOptions {
            sources: 0,
            ..base.clone()
        },
        GenOptions {
            size: 0,
            ..base.clone()
        },
        GenOptions {
            change_rate: 1.5,
            ..base.clone()
        },
        GenOptions {
            change_rate: f64::NAN,
            ..base.clone()
        },
        GenOptions {
            growth: f64::INFINITY,
            ..base.clone()
        },
        GenOptions {
            chunk: ChunkModel {
                min: 9000,
                avg: 8192,
                max: 65536,
            },
            ..base.clone()
        },
    ];
    for c in cases {
        assert!(
            matches!(Dataset::new(&c), Err(GenError::InvalidOptions(_))),
            "{c:?}"
        );
    }
    let mut ds = Dataset::new(&GenOptions {
        size: 1 << 16,
        ..base
    })
    .unwrap();
    let (_, l) = ds.next_version().unwrap();
    assert!(l.chunks().is_err());
}

/// Bytes of internal, adjacent, skip and unique chunks per version (mfdedup §3.3).
#[derive(Default)]
struct Classes {
    seen: HashMap<[u8; 20], u64>,
    rows: Vec<[u64; 4]>,
}

impl Classes {
    fn version(&mut self, chunks: impl Iterator<Item = ([u8; 20], u64)>) {
        let v = self.rows.len() as u64 + 1;
        let mut row = [0u64; 4];
        let mut current = Vec::new();
        let mut here = HashSet::new();
        for (fp, size) in chunks {
            let class = if here.contains(&fp) {
                0
            } else {
                match self.seen.get(&fp) {
                    Some(&last) if last == v - 1 => 1,
                    Some(_) => 2,
                    None => 3,
                }
            };
            row[class] += size;
            if here.insert(fp) {
                current.push(fp);
            }
        }
        for fp in current {
            self.seen.insert(fp, v);
        }
        self.rows.push(row);
    }

    fn fractions(&self) -> Vec<[f64; 4]> {
        self.rows
            .iter()
            .map(|r| {
                let t: u64 = r.iter().sum();
                r.map(|x| x as f64 / t as f64)
            })
            .collect()
    }
}

fn data_classes(opts: &GenOptions) -> Vec<[f64; 4]> {
    let cdc = FastCdc::new(2048, 8192, 65536);
    let mut classes = Classes::default();
    for (_, data) in versions(opts) {
        let mut lens = Vec::new();
        cut_all(&cdc, &data, true, &mut lens);
        let mut pos = 0usize;
        let chunks: Vec<([u8; 20], u64)> = lens
            .iter()
            .map(|&n| {
                let h = FingerprintAlgo::Blake3.hash(&data[pos..pos + n as usize]);
                pos += n as usize;
                let mut fp = [0u8; 20];
                fp.copy_from_slice(&h.0[..20]);
                (fp, u64::from(n))
            })
            .collect();
        classes.version(chunks.into_iter());
    }
    classes.fractions()
}

fn print_classes(name: &str, f: &[[f64; 4]]) {
    eprintln!("{name}: version internal adjacent skip unique");
    for (i, r) in f.iter().enumerate() {
        eprintln!(
            "  v{:02} {:.4} {:.4} {:.4} {:.4}",
            i + 1,
            r[0],
            r[1],
            r[2],
            r[3]
        );
    }
}

/// Checks per-version class fractions after the first version: skip
/// duplicates under 1 %, unique data a few percent on average.
fn check_classes(f: &[[f64; 4]], unique_mean: std::ops::Range<f64>) {
    for r in &f[1..] {
        assert!(r[2] < 0.01, "skip {r:?}");
        assert!(r[3] < 0.15, "unique {r:?}");
        assert!(r[0] + r[1] > 0.85, "{r:?}");
    }
    let mean = f[1..].iter().map(|r| r[3]).sum::<f64>() / (f.len() - 1) as f64;
    assert!(unique_mean.contains(&mean), "mean unique {mean}");
}

#[test]
fn chunk_classes_look_like_backups() {
    let opts = GenOptions {
        versions: 8,
        size: 8 << 20,
        seed: 5,
        ..GenOptions::default()
    };
    let f = data_classes(&opts);
    print_classes("data", &f);
    check_classes(&f, 0.01..0.08);
    let mut t = opts.clone();
    t.trace = true;
    t.size = 32 << 20;
    let mut ds = Dataset::new(&t).unwrap();
    let mut classes = Classes::default();
    while let Some((_, l)) = ds.next_version() {
        classes.version(l.chunks().unwrap().filter_map(|e| match e {
            TraceEvent::Chunk(c) => {
                let mut fp = [0u8; 20];
                fp.copy_from_slice(&c.fp[..20]);
                Some((fp, u64::from(c.size)))
            }
            _ => None,
        }));
    }
    let f = classes.fractions();
    print_classes("trace", &f);
    check_classes(&f, 0.005..0.08);
}

/// Every file and directory below `root` as (path, size, mtime, mode),
/// directories ending in `/`, sorted.
fn walk(root: &Path) -> Vec<(String, u64, u64, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            if m.is_dir() {
                stack.push(e.path());
                out.push((format!("{rel}/"), 0, m.mtime() as u64, m.mode() & 0o7777));
            } else {
                out.push((rel, m.len(), m.mtime() as u64, m.mode() & 0o7777));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn tree_mode_writes_the_archives_files_as_directories() {
    let dir = tempfile::tempdir().unwrap();
    let opts = GenOptions {
        versions: 3,
        size: 300_000,
        seed: 5,
        ..GenOptions::default()
    };
    let tree_opts = GenOptions {
        tree: true,
        ..opts.clone()
    };
    let summary = generate(dir.path(), &tree_opts).unwrap();
    assert_eq!(summary.versions.len(), 3);
    for ((info, tar), v) in versions(&opts).into_iter().zip(&summary.versions) {
        assert_eq!(info.file_name.trim_end_matches(".tar"), v.info.file_name);
        assert!(v.path.is_dir());
        let mut members: Vec<(String, u64, u64, u32)> = parse_tar(&tar)
            .unwrap()
            .into_iter()
            .map(|e| (e.path, e.size, e.mtime, e.mode))
            .collect();
        members.sort();
        assert_eq!(walk(&v.path), members, "{}", v.info.file_name);
        let bytes: u64 = members.iter().map(|m| m.1).sum();
        assert_eq!(v.logical_bytes, bytes);
    }
    // Generating again replaces the trees it wrote; a foreign tree is kept.
    generate(dir.path(), &tree_opts).unwrap();
    let other = tempfile::tempdir().unwrap();
    fs::create_dir(other.path().join("v0001")).unwrap();
    assert!(generate(other.path(), &tree_opts).is_err());
    assert!(GenOptions {
        trace: true,
        ..tree_opts
    }
    .validate()
    .is_err());
}
