//! The experiment report: one self-contained HTML file with an inline SVG
//! plot per metric, each against the backup version, one line per system.

use crate::experiment::{Results, VersionRecord};
use plotters::prelude::*;

/// A plotted metric: title, y-axis label, and the value of a record (if any).
pub struct Metric {
    /// Plot title.
    pub title: &'static str,
    /// Y-axis label.
    pub unit: &'static str,
    /// The value for one record.
    pub value: fn(&VersionRecord) -> Option<f64>,
}

/// Every metric the report plots.
pub const METRICS: &[Metric] = &[
    Metric {
        title: "Actual deduplication ratio",
        unit: "retained logical / stored before compression",
        value: |r| Some(r.actual_dedup_ratio),
    },
    Metric {
        title: "Compression ratio",
        unit: "stored bytes before / after compression (retained backups)",
        value: |r| Some(r.compression_ratio),
    },
    Metric {
        title: "Backup throughput",
        unit: "MB/s",
        value: |r| Some(r.backup_mb_s),
    },
    Metric {
        title: "Modelled backup I/O time on a 7200 rpm HDD",
        unit: "seconds",
        value: |r| Some(r.modelled_backup_seconds),
    },
    Metric {
        title: "Restore throughput (newest backup)",
        unit: "MB/s",
        value: |r| r.restores.last().map(|x| x.stats.throughput_mb_s),
    },
    Metric {
        title: "Read amplification (newest backup)",
        unit: "bytes read / bytes restored",
        value: |r| r.restores.last().map(|x| x.stats.read_amplification),
    },
    Metric {
        title: "Speed factor (newest backup)",
        unit: "MiB restored per container read",
        value: |r| r.restores.last().map(|x| x.stats.speed_factor),
    },
    Metric {
        title: "Containers read (newest backup)",
        unit: "containers",
        value: |r| r.restores.last().map(|x| x.stats.containers_read as f64),
    },
    Metric {
        title: "Modelled restore time on a 7200 rpm HDD (newest backup)",
        unit: "seconds",
        value: |r| r.restores.last().map(|x| x.modelled_seconds),
    },
    Metric {
        title: "Index memory",
        unit: "MiB",
        value: |r| Some(r.index_memory_bytes as f64 / 1048576.0),
    },
    Metric {
        title: "On-disk index lookups",
        unit: "table reads per backup",
        value: |r| Some(r.index.disk_lookups as f64),
    },
    Metric {
        title: "Index prefetches",
        unit: "metadata runs read per backup (log runs, container metadata)",
        value: |r| Some((r.index.prefetches + r.index.container_loads) as f64),
    },
    Metric {
        title: "Delta compression savings",
        unit: "MB not stored per backup (chunks stored as deltas)",
        value: |r| Some(r.delta.bytes_saved as f64 / 1e6),
    },
    Metric {
        title: "GC / arranging time per round",
        unit: "seconds",
        value: |r| {
            let gc = r.gc.as_ref().map(|g| g.stats.seconds);
            let arrange = r.arrange.as_ref().map(|a| a.seconds);
            match (gc, arrange) {
                (None, None) => None,
                (g, a) => Some(g.unwrap_or(0.0) + a.unwrap_or(0.0)),
            }
        },
    },
    Metric {
        title: "GC / arranging bytes moved per round",
        unit: "MiB read + written",
        value: |r| {
            r.gc.as_ref()
                .map(|g| (g.stats.bytes_read + g.stats.bytes_written) as f64 / 1048576.0)
        },
    },
];

/// The points of `metric` per system, in system order.
pub fn series<'a>(results: &'a Results, metric: &Metric) -> Vec<(&'a str, Vec<(f64, f64)>)> {
    results
        .config
        .systems
        .iter()
        .map(|s| {
            let points = results
                .records
                .iter()
                .filter(|r| r.system == s.name)
                .filter_map(|r| (metric.value)(r).map(|v| (r.version as f64, v)))
                .filter(|(_, v)| v.is_finite())
                .collect();
            (s.name.as_str(), points)
        })
        .collect()
}

fn plot(results: &Results, metric: &Metric) -> Result<String, String> {
    let data = series(results, metric);
    let all: Vec<(f64, f64)> = data.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    if all.is_empty() {
        return Ok(String::new());
    }
    let x_max = all.iter().map(|p| p.0).fold(1.0, f64::max);
    let y_max = all.iter().map(|p| p.1).fold(0.0, f64::max);
    let y_min = all
        .iter()
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min)
        .min(0.0);
    let y_top = if y_max > y_min {
        y_max * 1.08
    } else {
        y_min + 1.0
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 380)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(metric.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(1.0..x_max.max(2.0), y_min..y_top)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("backup version")
            .y_desc(metric.unit)
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (name, points)) in data.into_iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The report as one HTML document.
pub fn render(results: &Results) -> String {
    let mut html = String::new();
    html.push_str("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>");
    html.push_str(&escape(&results.config.name));
    html.push_str("</title><style>body{font-family:sans-serif;margin:2em;max-width:1500px}figure{display:inline-block;margin:.5em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}</style></head><body>\n");
    html.push_str(&format!(
        "<h1>Tessera experiment: {}</h1>\n<p>{} versions, {} systems, {:.1} s.</p>\n",
        escape(&results.config.name),
        results.versions.len(),
        results.config.systems.len(),
        results.seconds
    ));
    html.push_str("<h2>Means over the last versions</h2>\n");
    html.push_str(&summary_table(results));
    if !results.final_restores.is_empty() {
        html.push_str("<h2>All retained backups restored after the last version</h2>\n");
        html.push_str(&final_table(results));
    }
    html.push_str("<h2>Per version</h2>\n");
    for m in METRICS {
        match plot(results, m) {
            Ok(svg) if svg.is_empty() => {}
            Ok(svg) => {
                html.push_str("<figure>");
                html.push_str(&svg);
                html.push_str("</figure>\n");
            }
            Err(e) => html.push_str(&format!(
                "<p>plot {:?} failed: {}</p>\n",
                m.title,
                escape(&e)
            )),
        }
    }
    html.push_str("<h2>Systems</h2><pre>");
    html.push_str(&escape(
        &serde_json::to_string_pretty(&results.config.systems).unwrap_or_default(),
    ));
    html.push_str("</pre></body></html>\n");
    html
}

/// Per system, the mean of every metric over the last `retained` versions
/// (the retention window, or all versions).
pub fn summary(results: &Results) -> Vec<(String, Vec<Option<f64>>)> {
    let window = results
        .config
        .retention
        .keep_last
        .unwrap_or(results.versions.len())
        .max(1);
    let first = results.versions.len().saturating_sub(window) + 1;
    results
        .config
        .systems
        .iter()
        .map(|s| {
            let rows: Vec<&VersionRecord> = results
                .records
                .iter()
                .filter(|r| r.system == s.name && r.version >= first)
                .collect();
            let means = METRICS
                .iter()
                .map(|m| {
                    let vals: Vec<f64> = rows
                        .iter()
                        .filter_map(|r| (m.value)(r))
                        .filter(|v| v.is_finite())
                        .collect();
                    (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64)
                })
                .collect();
            (s.name.clone(), means)
        })
        .collect()
}

fn final_table(results: &Results) -> String {
    let mut t = String::from("<table><tr><th>system</th><th>backups</th><th>mean read amplification</th><th>mean speed factor</th><th>mean restore MB/s</th><th>mean modelled restore s</th><th>GC containers produced</th><th>GC MiB moved</th><th>GC s</th></tr>\n");
    for f in &results.final_restores {
        t.push_str(&format!(
            "<tr><th>{}</th><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.0}</td><td>{:.3}</td><td>{}</td><td>{:.1}</td><td>{:.2}</td></tr>\n",
            escape(&f.system),
            f.restores.len(),
            f.mean_read_amplification,
            f.mean_speed_factor,
            f.mean_restore_mb_s,
            f.mean_modelled_seconds,
            f.gc_containers_produced,
            f.gc_bytes_moved as f64 / 1048576.0,
            f.gc_seconds
        ));
    }
    t.push_str("</table>\n");
    t
}

fn summary_table(results: &Results) -> String {
    let mut t = String::from("<table><tr><th>system</th>");
    for m in METRICS {
        t.push_str(&format!(
            "<th>{}<br><small>{}</small></th>",
            escape(m.title),
            escape(m.unit)
        ));
    }
    t.push_str("</tr>\n");
    for (name, means) in summary(results) {
        t.push_str(&format!("<tr><th>{}</th>", escape(&name)));
        for v in means {
            match v {
                Some(v) => t.push_str(&format!("<td>{v:.3}</td>")),
                None => t.push_str("<td>–</td>"),
            }
        }
        t.push_str("</tr>\n");
    }
    t.push_str("</table>\n");
    t
}
