//! The example experiment, scaled down: it runs, records finite metrics for
//! every system and version, and renders a report with a plot per metric.

use std::path::Path;
use tessera_lab::experiment::{run, ExperimentConfig};
use tessera_lab::report::{series, METRICS};

#[test]
fn example_experiment_runs_and_renders_every_plot() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/baselines.toml");
    let mut config = ExperimentConfig::load(&example).unwrap();
    // Same systems and policies, a much smaller dataset.
    let g = config.dataset.generate.as_mut().unwrap();
    g.versions = 6;
    g.size = "2MB".into();
    config.retention.keep_last = Some(3);
    let out = tempfile::tempdir().unwrap();
    let mut lines = 0;
    let results = run(&config, out.path(), &mut |_| lines += 1).unwrap();

    assert_eq!(results.versions.len(), 6);
    let finals = usize::from(config.restore.retained_at_end);
    assert_eq!(
        lines,
        (6 + finals) * config.systems.len(),
        "one progress line per system and version (and per final restore round)"
    );
    assert_eq!(results.final_restores.len(), finals * config.systems.len());
    for f in &results.final_restores {
        assert_eq!(
            f.restores.len(),
            3,
            "{}: every retained backup restored",
            f.system
        );
        assert!(f.mean_read_amplification.is_finite() && f.mean_read_amplification > 0.0);
    }
    assert_eq!(results.records.len(), 6 * config.systems.len());
    for r in &results.records {
        // Container headers and metadata count as physical bytes: a first backup is just below 1.
        assert!(
            r.actual_dedup_ratio.is_finite() && r.actual_dedup_ratio > 0.95,
            "{r:?}"
        );
        assert!(r.backup_mb_s.is_finite() && r.backup_mb_s > 0.0);
        // Every backup writes at least its containers or its index.
        assert!(r.modelled_backup_seconds.is_finite() && r.modelled_backup_seconds > 0.0);
        assert!(
            !r.restores.is_empty(),
            "the newest backup is restored every version"
        );
        for x in &r.restores {
            // Below 1 when internal duplicates are served from the cache.
            assert!(x.stats.read_amplification.is_finite() && x.stats.read_amplification > 0.0);
            assert!(x.modelled_seconds.is_finite() && x.modelled_seconds > 0.0);
        }
        assert!(r.gc.is_some(), "GC runs after every backup");
        if r.version > 3 {
            assert!(
                r.gc.as_ref().is_some_and(|g| g.forgotten > 0),
                "retention deletes one backup per version"
            );
        }
    }

    let html = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    for m in METRICS {
        let data = series(&results, m);
        assert_eq!(data.len(), config.systems.len());
        assert!(
            data.iter().all(|(_, points)| !points.is_empty()),
            "{} has no points",
            m.title
        );
        assert!(
            html.contains(m.title),
            "report lacks a plot titled {:?}",
            m.title
        );
    }
    assert_eq!(
        html.matches("<svg").count(),
        METRICS.len(),
        "one SVG per metric"
    );
    assert!(!html.contains("NaN") && !html.contains("inf"));
    let csv = std::fs::read_to_string(out.path().join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + results.records.len());
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    assert_eq!(
        json["records"].as_array().unwrap().len(),
        results.records.len()
    );
}
