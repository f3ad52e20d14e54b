//! The experiment report: one self-contained HTML file with an inline SVG
//! plot per metric, each against the backup version, one line per system
//! (each with its own colour, dash style and marker; the legend, outside
//! the plot, gives every system's mean over the last versions).

use crate::types::{FinalRestores, RestoreRecord, Results, SystemSpec, VersionRecord};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use std::collections::BTreeMap;

/// A plotted metric: key, table group, title, y-axis label, and the value of
/// a record (if any).
pub struct Metric {
    /// Short name (for `[report] log_scale`).
    pub key: &'static str,
    /// The summary table the metric's column is in.
    pub group: &'static str,
    /// Plot title.
    pub title: &'static str,
    /// Y-axis label.
    pub unit: &'static str,
    /// The value for one record.
    pub value: fn(&VersionRecord) -> Option<f64>,
}

/// The restore of the newest backup after a version.
fn newest(r: &VersionRecord) -> Option<&RestoreRecord> {
    r.restores.last()
}

/// The restore of the oldest retained backup after a version (when it is
/// not the newest).
fn oldest(r: &VersionRecord) -> Option<&RestoreRecord> {
    (r.restores.len() > 1).then(|| &r.restores[0])
}

const BACKUP: &str = "Backup";
const INDEX: &str = "Index and delta compression";
const NEWEST: &str = "Restore of the newest backup";
const OLDEST: &str = "Restore of the oldest retained backup";
const GC: &str = "GC / arranging (data movement)";

/// Every metric the report plots.
pub const METRICS: &[Metric] = &[
    Metric {
        key: "dedup_ratio",
        group: BACKUP,
        title: "Actual deduplication ratio",
        unit: "retained logical / stored before compression",
        value: |r| Some(r.actual_dedup_ratio),
    },
    Metric {
        key: "compression_ratio",
        group: BACKUP,
        title: "Compression ratio",
        unit: "stored bytes before / after compression (retained backups)",
        value: |r| Some(r.compression_ratio),
    },
    Metric {
        key: "backup_mb_s",
        group: BACKUP,
        title: "Backup throughput",
        unit: "MB/s",
        value: |r| Some(r.backup_mb_s),
    },
    Metric {
        key: "modelled_backup_seconds",
        group: BACKUP,
        title: "Modelled backup I/O time (disk model)",
        unit: "seconds",
        value: |r| Some(r.modelled_backup_seconds),
    },
    Metric {
        key: "index_memory",
        group: INDEX,
        title: "Index memory",
        unit: "MiB",
        value: |r| Some(r.index_memory_bytes as f64 / 1048576.0),
    },
    Metric {
        key: "index_entries",
        group: INDEX,
        title: "Index entries",
        unit: "fingerprints indexed",
        value: |r| Some(r.index_entries as f64),
    },
    Metric {
        key: "index_disk_lookups",
        group: INDEX,
        title: "On-disk index lookups",
        unit: "table reads per backup",
        value: |r| Some(r.index.disk_lookups as f64),
    },
    Metric {
        key: "index_prefetches",
        group: INDEX,
        title: "Index prefetches",
        unit: "metadata runs read per backup",
        value: |r| Some((r.index.prefetches + r.index.container_loads) as f64),
    },
    Metric {
        key: "delta_saved",
        group: INDEX,
        title: "Delta compression savings",
        unit: "MB not stored per backup",
        value: |r| Some(r.delta.bytes_saved as f64 / 1e6),
    },
    Metric {
        key: "restore_mb_s",
        group: NEWEST,
        title: "Restore throughput (newest backup)",
        unit: "MB/s",
        value: |r| newest(r).map(|x| x.stats.throughput_mb_s),
    },
    Metric {
        key: "read_amplification",
        group: NEWEST,
        title: "Read amplification (newest backup)",
        unit: "bytes read / stored bytes of the chunks restored",
        value: |r| newest(r).map(|x| x.read_amplification()),
    },
    Metric {
        key: "speed_factor",
        group: NEWEST,
        title: "Speed factor per container read (newest backup)",
        unit: "stored MiB restored per container or object read",
        value: |r| newest(r).map(|x| x.speed_factor()),
    },
    Metric {
        key: "speed_factor_per_extent",
        group: NEWEST,
        title: "Speed factor per extent (newest backup)",
        unit: "MiB restored per read extent (seek)",
        value: |r| newest(r).map(|x| x.speed_factor_per_extent),
    },
    Metric {
        key: "containers_read",
        group: NEWEST,
        title: "Containers read (newest backup)",
        unit: "containers or objects",
        value: |r| newest(r).map(|x| x.stats.containers_read as f64),
    },
    Metric {
        key: "extents",
        group: NEWEST,
        title: "Extents read (newest backup)",
        unit: "read extents (seeks)",
        value: |r| newest(r).map(|x| x.stats.extents as f64),
    },
    Metric {
        key: "modelled_restore_seconds",
        group: NEWEST,
        title: "Modelled restore time (newest backup)",
        unit: "seconds (a seek per extent + bandwidth)",
        value: |r| newest(r).map(|x| x.modelled_seconds),
    },
    Metric {
        key: "restore_mb_s_oldest",
        group: OLDEST,
        title: "Restore throughput (oldest retained backup)",
        unit: "MB/s",
        value: |r| oldest(r).map(|x| x.stats.throughput_mb_s),
    },
    Metric {
        key: "read_amplification_oldest",
        group: OLDEST,
        title: "Read amplification (oldest retained backup)",
        unit: "bytes read / stored bytes of the chunks restored",
        value: |r| oldest(r).map(|x| x.read_amplification()),
    },
    Metric {
        key: "speed_factor_oldest",
        group: OLDEST,
        title: "Speed factor per container read (oldest retained backup)",
        unit: "stored MiB restored per container or object read",
        value: |r| oldest(r).map(|x| x.speed_factor()),
    },
    Metric {
        key: "speed_factor_per_extent_oldest",
        group: OLDEST,
        title: "Speed factor per extent (oldest retained backup)",
        unit: "MiB restored per read extent (seek)",
        value: |r| oldest(r).map(|x| x.speed_factor_per_extent),
    },
    Metric {
        key: "modelled_restore_seconds_oldest",
        group: OLDEST,
        title: "Modelled restore time (oldest retained backup)",
        unit: "seconds (a seek per extent + bandwidth)",
        value: |r| oldest(r).map(|x| x.modelled_seconds),
    },
    Metric {
        key: "gc_seconds",
        group: GC,
        title: "GC / arranging time per round",
        unit: "seconds",
        value: |r| r.data_moved_seconds(),
    },
    Metric {
        key: "data_moved",
        group: GC,
        title: "GC / arranging bytes moved per round",
        unit: "MiB read + written",
        value: |r| r.data_moved_bytes().map(|b| b as f64 / 1048576.0),
    },
];

/// The median, minimum and maximum of some values (one per run).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// The median.
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (none if there are none).
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// The values of `metric` for system `name`, per version, one per run.
fn per_version(results: &Results, name: &str, metric: &Metric) -> BTreeMap<usize, Vec<f64>> {
    let mut m: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for r in results.records.iter().filter(|r| r.system == name) {
        if let Some(v) = (metric.value)(r).filter(|v| v.is_finite()) {
            m.entry(r.version).or_default().push(v);
        }
    }
    m
}

/// The points of `metric` per system, in system order: per version, the
/// median over the runs (the value itself with one run).
pub fn series<'a>(results: &'a Results, metric: &Metric) -> Vec<(&'a str, Vec<(f64, f64)>)> {
    spreads(results, metric)
        .into_iter()
        .map(|(name, points)| {
            (
                name,
                points.into_iter().map(|(x, s)| (x, s.median)).collect(),
            )
        })
        .collect()
}

/// Per system, per version, the spread of `metric` over the runs.
pub fn spreads<'a>(results: &'a Results, metric: &Metric) -> Vec<(&'a str, Vec<(f64, Spread)>)> {
    results
        .config
        .systems
        .iter()
        .map(|s| {
            let points = per_version(results, &s.name, metric)
                .into_iter()
                .filter_map(|(v, vals)| Spread::of(&vals).map(|sp| (v as f64, sp)))
                .collect();
            (s.name.as_str(), points)
        })
        .collect()
}

/// The versions the summary averages over: the last `keep_last` (the
/// retention window), or all; returns (N, first version).
pub fn window(results: &Results) -> (usize, usize) {
    let n = results.versions.len();
    let w = results
        .config
        .retention
        .keep_last
        .unwrap_or(n)
        .clamp(1, n.max(1));
    (w, n.saturating_sub(w) + 1)
}

/// Per system, for every metric, the spread over the runs of the metric's
/// mean over the last versions ([`window`]).
pub fn summary(results: &Results) -> Vec<(String, Vec<Option<Spread>>)> {
    let (_, first) = window(results);
    results
        .config
        .systems
        .iter()
        .map(|s| {
            let spreads = METRICS
                .iter()
                .map(|m| {
                    let means: Vec<f64> = (1..=results.config.repeat)
                        .filter_map(|run| {
                            let vals: Vec<f64> = results
                                .records
                                .iter()
                                .filter(|r| {
                                    r.system == s.name && r.repeat == run && r.version >= first
                                })
                                .filter_map(|r| (m.value)(r))
                                .filter(|v| v.is_finite())
                                .collect();
                            (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64)
                        })
                        .collect();
                    Spread::of(&means)
                })
                .collect();
            (s.name.clone(), spreads)
        })
        .collect()
}

/// `v` with about three significant digits.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.001 {
        format!("{v:.3}")
    } else {
        format!("{v:.2e}")
    }
}

/// A spread as text: the median, and the range when the runs differ.
fn spread_text(s: &Spread) -> String {
    if s.max > s.min {
        format!("{} ({}–{})", number(s.median), number(s.min), number(s.max))
    } else {
        number(s.median)
    }
}

/// How series `i` is drawn: dash pattern (0 solid, 1 dashed, 2 dotted),
/// marker shape (0 circle, 1 triangle, 2 square, 3 cross) and whether the
/// marker is filled. Neighbours in the list differ in all three.
pub fn style_of(i: usize) -> (usize, usize, bool) {
    (i % 3, i % 4, (i / 4).is_multiple_of(2))
}

/// The name of an earlier series with exactly the same points as series
/// `i`, if any (its lines are then drawn over each other).
fn same_as<'a>(data: &[(&'a str, Vec<(f64, Spread)>)], i: usize) -> Option<&'a str> {
    let points = &data[i].1;
    if points.is_empty() {
        return None;
    }
    data[..i]
        .iter()
        .find(|(_, p)| {
            p.len() == points.len()
                && p.iter()
                    .zip(points)
                    .all(|(a, b)| a.0 == b.0 && a.1.median == b.1.median)
        })
        .map(|(n, _)| *n)
}

const CHART_W: u32 = 640;
const LEGEND_W: u32 = 300;

fn draw_marker<CT: CoordTranslate>(
    area: &DrawingArea<SVGBackend, CT>,
    at: CT::From,
    shape: usize,
    style: ShapeStyle,
) -> Result<(), String> {
    match shape {
        0 => area.draw(&Circle::new(at, 4, style)),
        1 => area.draw(&TriangleMarker::new(at, 5, style)),
        2 => area.draw(&(EmptyElement::at(at) + Rectangle::new([(-3, -3), (3, 3)], style))),
        _ => area.draw(&Cross::new(at, 4, style)),
    }
    .map_err(|e| e.to_string())
}

fn draw_line<CT: CoordTranslate>(
    area: &DrawingArea<SVGBackend, CT>,
    points: Vec<CT::From>,
    dash: usize,
    style: ShapeStyle,
) -> Result<(), String>
where
    CT::From: Clone,
{
    match dash {
        0 => area.draw(&PathElement::new(points, style)),
        1 => area.draw(&DashedPathElement::new(points, 7, 4, style)),
        _ => area.draw(&DashedPathElement::new(points, 2, 3, style)),
    }
    .map_err(|e| e.to_string())
}

/// Draws the lines, markers and (with several runs) min–max bars of `data`.
fn draw_series<CT: CoordTranslate<From = (f64, f64)>>(
    area: &DrawingArea<SVGBackend, CT>,
    data: &[(&str, Vec<(f64, Spread)>)],
) -> Result<(), String> {
    for (i, (_, points)) in data.iter().enumerate() {
        let (dash, shape, filled) = style_of(i);
        let color = Palette99::pick(i).to_rgba();
        let line = color.stroke_width(2);
        draw_line(
            area,
            points.iter().map(|(x, s)| (*x, s.median)).collect(),
            dash,
            line,
        )?;
        for (x, s) in points {
            if s.max > s.min {
                area.draw(&PathElement::new(
                    vec![(*x, s.min), (*x, s.max)],
                    color.stroke_width(1),
                ))
                .map_err(|e| e.to_string())?;
            }
        }
        // About 12 markers per line, shifted per series so that lines drawn
        // over each other still show each one's markers.
        let every = points.len().div_ceil(12).max(1);
        let marker = if filled {
            color.filled()
        } else {
            color.stroke_width(2)
        };
        for (j, (x, s)) in points.iter().enumerate() {
            if (j + i) % every == 0 {
                draw_marker(area, (*x, s.median), shape, marker)?;
            }
        }
    }
    Ok(())
}

/// The legend, right of the plot: a sample of each line with the system's
/// mean over the window.
fn draw_legend(
    area: &DrawingArea<SVGBackend, Shift>,
    data: &[(&str, Vec<(f64, Spread)>)],
    means: &[Option<Spread>],
    window: (usize, usize),
) -> Result<(), String> {
    let text = |s: &str, at: (i32, i32), size: i32| {
        area.draw(&Text::new(s.to_string(), at, ("sans-serif", size)))
            .map_err(|e| e.to_string())
    };
    text(
        &format!("mean of the last {} versions", window.0),
        (4, 24),
        13,
    )?;
    for (i, (name, _)) in data.iter().enumerate() {
        let y = 48 + 18 * i as i32;
        let (dash, shape, filled) = style_of(i);
        let color = Palette99::pick(i).to_rgba();
        draw_line(area, vec![(6, y), (42, y)], dash, color.stroke_width(2))?;
        let marker = if filled {
            color.filled()
        } else {
            color.stroke_width(2)
        };
        draw_marker(area, (24, y), shape, marker)?;
        let mean = means
            .get(i)
            .copied()
            .flatten()
            .map_or("–".to_string(), |s| spread_text(&s));
        let same = same_as(data, i)
            .map(|o| format!(" (= {o})"))
            .unwrap_or_default();
        text(&format!("{name}{same}: {mean}"), (50, y - 7), 12)?;
    }
    Ok(())
}

/// Whether `metric` is drawn on a logarithmic axis.
fn log_scale(results: &Results, metric: &Metric) -> bool {
    results
        .config
        .report
        .log_scale
        .iter()
        .any(|k| k == "all" || k == metric.key)
}

fn plot(results: &Results, index: usize, means: &[Option<Spread>]) -> Result<String, String> {
    let metric = &METRICS[index];
    let data = spreads(results, metric);
    let all: Vec<(f64, Spread)> = data.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    if all.is_empty() {
        return Ok(String::new());
    }
    let x_max = all.iter().map(|p| p.0).fold(1.0, f64::max).max(2.0);
    let y_max = all
        .iter()
        .map(|p| p.1.max)
        .fold(f64::NEG_INFINITY, f64::max);
    let y_low = all.iter().map(|p| p.1.min).fold(f64::INFINITY, f64::min);
    let log = log_scale(results, metric) && y_low > 0.0;
    let height = (60 + 18 * data.len() as u32).max(380);
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (CHART_W + LEGEND_W, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(CHART_W);
        let title = if log {
            format!("{} (log scale)", metric.title)
        } else {
            metric.title.to_string()
        };
        let mut builder = ChartBuilder::on(&left);
        builder
            .caption(title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        if log {
            let mut chart = builder
                .build_cartesian_2d(1.0..x_max, (y_low / 1.2..y_max * 1.2).log_scale())
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("backup version")
                .y_desc(metric.unit)
                .draw()
                .map_err(|e| e.to_string())?;
            draw_series(chart.plotting_area(), &data)?;
        } else {
            let y_min = y_low.min(0.0);
            let y_top = if y_max > y_min {
                y_max * 1.08
            } else {
                y_min + 1.0
            };
            let mut chart = builder
                .build_cartesian_2d(1.0..x_max, y_min..y_top)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("backup version")
                .y_desc(metric.unit)
                .draw()
                .map_err(|e| e.to_string())?;
            draw_series(chart.plotting_area(), &data)?;
        }
        draw_legend(&right, &data, means, window(results))?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// What a plot's numbers are, for its caption.
fn caption(results: &Results) -> String {
    let (n, first) = window(results);
    let mut c = format!(
        "Legend: each system's mean of the last {n} versions ({first}–{}).",
        results.versions.len()
    );
    if results.config.repeat > 1 {
        c.push_str(&format!(
            " Lines and means: median of {} runs; bars and parentheses: min–max.",
            results.config.repeat
        ));
    }
    c
}

/// The report as one HTML document.
pub fn render(results: &Results) -> String {
    let mut html = String::new();
    html.push_str("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>");
    html.push_str(&escape(&results.config.name));
    html.push_str("</title><style>body{font-family:sans-serif;margin:1em;max-width:1380px}figure{display:inline-block;margin:.5em}figcaption{font-size:80%;color:#444}table{border-collapse:collapse;margin-bottom:1em;max-width:1380px}td,th{border:1px solid #ccc;padding:.2em .4em;text-align:right}th small{font-weight:normal}td{white-space:nowrap}details pre{font-size:80%}</style></head><body>\n");
    html.push_str(&format!(
        "<h1>Tessera experiment: {}</h1>\n",
        escape(&results.config.name)
    ));
    html.push_str(&provenance(results));
    let (n, first) = window(results);
    html.push_str(&format!(
        "<h2>Mean of the last {n} versions ({first}–{})</h2>\n",
        results.versions.len()
    ));
    if results.config.repeat > 1 {
        html.push_str(&format!(
            "<p>Median of {} runs; in parentheses the smallest and largest.</p>\n",
            results.config.repeat
        ));
    }
    html.push_str(&summary_tables(results));
    if !results.final_restores.is_empty() {
        html.push_str("<h2>All retained backups restored after the last version</h2>\n");
        html.push_str(&final_table(results));
        html.push_str(&bound_table(results));
        html.push_str(&compression_table(results));
    }
    html.push_str("<h2>Per version</h2>\n");
    let summary = summary(results);
    let caption = escape(&caption(results));
    for (i, m) in METRICS.iter().enumerate() {
        let means: Vec<Option<Spread>> = summary.iter().map(|(_, s)| s[i]).collect();
        match plot(results, i, &means) {
            Ok(svg) if svg.is_empty() => {}
            Ok(svg) => {
                html.push_str("<figure>");
                html.push_str(&svg);
                html.push_str(&format!("<figcaption>{caption}</figcaption></figure>\n"));
            }
            Err(e) => html.push_str(&format!(
                "<p>plot {:?} failed: {}</p>\n",
                m.title,
                escape(&e)
            )),
        }
    }
    html.push_str("<h2>Configuration</h2><details open><summary>experiment</summary><pre>");
    html.push_str(&escape(
        &serde_json::to_string_pretty(&results.config).unwrap_or_default(),
    ));
    html.push_str(
        "</pre></details><details><summary>repositories (every parameter)</summary><pre>",
    );
    html.push_str(&escape(
        &serde_json::to_string_pretty(&results.repository_configs).unwrap_or_default(),
    ));
    html.push_str("</pre></details></body></html>\n");
    html
}

/// The run's provenance and timing as a paragraph.
fn provenance(results: &Results) -> String {
    let p = &results.provenance;
    let expected = results
        .config
        .expected_run_time
        .as_deref()
        .map(|e| format!(" (expected: {})", escape(e)))
        .unwrap_or_default();
    format!(
        "<p>{} versions, {} systems, {} run{}, {:.1} s{expected}. Each version is read once before its first backup, so every system reads it from the page cache alike.</p>\n<p>Tessera {} (commit {}), {} ({} cores), started {}.</p>\n",
        results.versions.len(),
        results.config.systems.len(),
        results.config.repeat,
        if results.config.repeat == 1 { "" } else { "s" },
        results.seconds,
        escape(&p.tessera_version),
        escape(&p.git_commit),
        escape(&p.cpu_model),
        p.cores,
        escape(&p.date),
    )
}

fn final_table(results: &Results) -> String {
    let mut t = String::from("<table><tr><th>system</th><th>backups</th><th>mean read amplification</th><th>mean speed factor<br><small>per container read</small></th><th>mean speed factor<br><small>per extent</small></th><th>mean restore MB/s</th><th>mean modelled restore s</th><th>GC containers produced</th><th>GC / arranging MiB moved<br><small>read + written</small></th><th>GC / arranging s</th></tr>\n");
    let mut by_system: BTreeMap<&str, Vec<&FinalRestores>> = BTreeMap::new();
    for f in &results.final_restores {
        by_system.entry(f.system.as_str()).or_default().push(f);
    }
    for s in &results.config.systems {
        let Some(runs) = by_system.get(s.name.as_str()) else {
            continue;
        };
        let cell = |f: &dyn Fn(&FinalRestores) -> f64| {
            let vals: Vec<f64> = runs.iter().map(|r| f(r)).collect();
            Spread::of(&vals).map_or("–".into(), |s| spread_text(&s))
        };
        t.push_str(&format!(
            "<tr><th>{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            escape(&s.name),
            cell(&|f| f.restores.len() as f64),
            cell(&|f| f.mean_read_amplification),
            cell(&|f| f.mean_speed_factor),
            cell(&|f| f.mean_speed_factor_per_extent),
            cell(&|f| f.mean_restore_mb_s),
            cell(&|f| f.mean_modelled_seconds),
            cell(&|f| f.gc_containers_produced as f64),
            cell(&|f| (f.gc_bytes_moved + f.arrange_bytes_moved) as f64 / 1048576.0),
            cell(&|f| f.gc_seconds + f.arrange_seconds),
        ));
    }
    t.push_str("</table>\n");
    t
}

/// Per system, the median over the runs of `f` of its final restores ("–"
/// without any).
fn final_cell(results: &Results, system: &str, f: &dyn Fn(&FinalRestores) -> f64) -> String {
    let vals: Vec<f64> = results
        .final_restores
        .iter()
        .filter(|r| r.system == system)
        .map(f)
        .collect();
    Spread::of(&vals).map_or("–".into(), |s| spread_text(&s))
}

/// The containers the final restores touched against the fewest any order
/// of the same copy-forward could have left them.
fn bound_table(results: &Results) -> String {
    let mut t = String::from("<h3>Containers per restore and the copy-forward bound</h3>\n<table><tr><th>system</th><th>mean containers read</th><th>mean containers referenced</th><th>mean bound<br><small>any copy-forward order</small></th><th>mean modelled restore s</th><th>mean modelled bound s</th><th>physical MB</th><th>total ratio</th><th>mixed ownership<br><small>before / after the last GC</small></th></tr>\n");
    for s in &results.config.systems {
        let name = s.name.as_str();
        let cell = |f: &dyn Fn(&FinalRestores) -> f64| final_cell(results, name, f);
        t.push_str(&format!(
            "<tr><th>{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            escape(name),
            cell(&|f| f.mean_containers_read),
            cell(&|f| f.mean_containers_referenced),
            cell(&|f| f.mean_containers_bound),
            cell(&|f| f.mean_modelled_seconds),
            cell(&|f| f.mean_modelled_bound_seconds),
            cell(&|f| f.physical_bytes as f64 / 1e6),
            cell(&|f| f.total_ratio),
            last_ownership(results, name),
        ));
    }
    t.push_str("</table>\n");
    t
}

/// The share of retained bytes in mixed-ownership containers before and
/// after the last GC that counted it, median over the runs ("–" without).
fn last_ownership(results: &Results, system: &str) -> String {
    let mut before = Vec::new();
    let mut after = Vec::new();
    for run in 1..=results.config.repeat {
        let last = results
            .records
            .iter()
            .filter(|r| r.system == system && r.repeat == run)
            .filter_map(|r| r.gc.as_ref())
            .filter_map(|g| g.ownership_before.zip(g.ownership_after))
            .next_back();
        if let Some((b, a)) = last {
            before.push(b.mixed_share());
            after.push(a.mixed_share());
        }
    }
    match (Spread::of(&before), Spread::of(&after)) {
        (Some(b), Some(a)) => format!("{} / {}", spread_text(&b), spread_text(&a)),
        _ => "–".into(),
    }
}

/// The systems of the compression axis: each plain system (compression
/// `off`) with its variants named `NAME.SETTING`.
pub fn compression_pairs(results: &Results) -> Vec<(&SystemSpec, Vec<&SystemSpec>)> {
    let off = |s: &SystemSpec| s.compression.as_deref().is_none_or(|c| c == "off");
    results
        .config
        .systems
        .iter()
        .filter(|s| off(s))
        .map(|plain| {
            let variants = results
                .config
                .systems
                .iter()
                .filter(|v| {
                    !off(v)
                        && v.compression
                            .as_deref()
                            .is_some_and(|c| v.name == format!("{}.{c}", plain.name))
                })
                .collect();
            (plain, variants)
        })
        .filter(|(_, v): &(_, Vec<_>)| !v.is_empty())
        .collect()
}

/// Each system plain and compressed side by side (final restores).
fn compression_table(results: &Results) -> String {
    let pairs = compression_pairs(results);
    if pairs.is_empty() {
        return String::new();
    }
    let mut t = String::from("<h3>Plain and compressed (each cell: plain / compressed)</h3>\n<table><tr><th>system</th><th>compression</th><th>physical MB</th><th>total ratio</th><th>mean read amplification<br><small>on stored bytes</small></th><th>mean speed factor<br><small>stored MiB per container</small></th><th>mean containers read</th><th>mean modelled restore s</th><th>GC MiB moved</th></tr>\n");
    for (plain, variants) in pairs {
        for v in variants {
            let cell = |f: &dyn Fn(&FinalRestores) -> f64| {
                format!(
                    "{} / {}",
                    final_cell(results, &plain.name, f),
                    final_cell(results, &v.name, f)
                )
            };
            t.push_str(&format!(
                "<tr><th>{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                escape(&plain.name),
                escape(v.compression.as_deref().unwrap_or("")),
                cell(&|f| f.physical_bytes as f64 / 1e6),
                cell(&|f| f.total_ratio),
                cell(&|f| f.mean_read_amplification),
                cell(&|f| f.mean_speed_factor),
                cell(&|f| f.mean_containers_read),
                cell(&|f| f.mean_modelled_seconds),
                cell(&|f| f.gc_bytes_moved as f64 / 1048576.0),
            ));
        }
    }
    t.push_str("</table>\n");
    t
}

/// The summary as one table per metric group (each narrow enough for a
/// 1400-pixel window), systems as rows.
fn summary_tables(results: &Results) -> String {
    let summary = summary(results);
    let mut groups: Vec<&str> = Vec::new();
    for m in METRICS {
        if !groups.contains(&m.group) {
            groups.push(m.group);
        }
    }
    let mut t = String::new();
    for group in groups {
        let columns: Vec<usize> = (0..METRICS.len())
            .filter(|&i| METRICS[i].group == group)
            .filter(|&i| summary.iter().any(|(_, s)| s[i].is_some()))
            .collect();
        if columns.is_empty() {
            continue;
        }
        t.push_str(&format!(
            "<h3>{}</h3>\n<table><tr><th>system</th>",
            escape(group)
        ));
        for &i in &columns {
            t.push_str(&format!(
                "<th>{}<br><small>{}</small></th>",
                escape(METRICS[i].title),
                escape(METRICS[i].unit)
            ));
        }
        t.push_str("</tr>\n");
        for (name, spreads) in &summary {
            t.push_str(&format!("<tr><th>{}</th>", escape(name)));
            for &i in &columns {
                match &spreads[i] {
                    Some(s) => t.push_str(&format!("<td>{}</td>", spread_text(s))),
                    None => t.push_str("<td>–</td>"),
                }
            }
            t.push_str("</tr>\n");
        }
        t.push_str("</table>\n");
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::{run, ExperimentConfig};

    #[test]
    fn neighbouring_series_differ_in_dash_marker_and_fill() {
        let styles: Vec<_> = (0..12).map(style_of).collect();
        for (i, a) in styles.iter().enumerate() {
            for b in &styles[i + 1..] {
                assert_ne!((a.0, a.1), (b.0, b.1), "the first 12 series all differ");
            }
        }
        assert_eq!(number(1234.567), "1235");
        assert_eq!(number(12.345), "12.3");
        assert_eq!(number(0.012345), "0.012");
        assert_eq!(
            Spread::of(&[3.0, 1.0, 2.0, 10.0]),
            Some(Spread {
                median: 2.5,
                min: 1.0,
                max: 10.0
            })
        );
    }

    #[test]
    fn report_marks_identical_systems_states_its_window_and_fits_the_window() {
        let tmp = tempfile::tempdir().unwrap();
        let text = "name = \"r\"\n[dataset.generate]\nversions = 4\nsize = \"300KB\"\n\
                    [retention]\nkeep_last = 3\n[restore]\noldest = true\n\
                    [report]\nlog_scale = [\"speed_factor\"]\n\
                    [[systems]]\nname = \"twin-a\"\n[[systems]]\nname = \"twin-b\"\n";
        let config: ExperimentConfig = toml::from_str(text).unwrap();
        let out = tmp.path().join("out");
        let results = run(&config, &out, &mut |_| {}).unwrap();
        let html = render(&results);
        // Identical systems are told apart in the legend.
        assert!(html.contains("twin-b (= twin-a)"));
        // Every plot states the window of its legend's means.
        let plots = html.matches("<svg").count();
        assert!(plots >= 15, "{plots}");
        let figures: Vec<&str> = html.split("<figure>").skip(1).collect();
        assert_eq!(figures.len(), plots);
        for f in figures {
            let svg = f.split("<figcaption>").next().unwrap();
            assert!(svg.contains("mean of the last 3 versions"), "{svg}");
        }
        assert!(html.contains("Speed factor per container read (newest backup) (log scale)"));
        assert!(html.contains("Restore throughput (oldest retained backup)"));
        // No summary table is wider than 8 columns (about 1400 px).
        for table in html.split("<table>").skip(1) {
            let header = table.split("</tr>").next().unwrap();
            assert!(header.matches("<th>").count() <= 10, "{header}");
        }
    }
}
