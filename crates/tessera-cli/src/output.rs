//! What the commands share for printing: one printer of reports (text or
//! JSON), human units, ratios, standard output for data streams and the
//! exit status of incomplete work.

use serde::Serialize;
use std::io::{self, Write};

use crate::progress::quiet;

/// Exit status of a backup (or restore, repair, find) that committed but left out objects it could not read.
pub const EXIT_INCOMPLETE: u8 = 3;

/// How a report is printed: as text, or as JSON on one line or indented
/// (each command keeps the form it has always printed).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Form {
    /// The human-readable text ([`Report::text`]).
    Text,
    /// JSON on one line.
    Json,
    /// Indented JSON.
    PrettyJson,
}

impl Form {
    /// Text, or JSON on one line with `--json`.
    pub fn json_if(json: bool) -> Self {
        if json {
            Form::Json
        } else {
            Form::Text
        }
    }

    /// Text, or indented JSON with `--json`.
    pub fn pretty_json_if(json: bool) -> Self {
        if json {
            Form::PrettyJson
        } else {
            Form::Text
        }
    }
}

/// The order of a report's JSON keys.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Keys {
    /// As the fields are declared.
    Declared,
    /// Sorted, at every depth: the order of the outputs that were first
    /// built as a `serde_json::Value` (whose maps are sorted), kept so
    /// that their bytes do not change.
    Sorted,
}

/// What a command prints: a `Serialize` value (its JSON) that can also
/// write itself as text.
pub trait Report: Serialize {
    /// The order of the JSON's keys.
    const KEYS: Keys = Keys::Declared;
    /// Whether the text is a summary (left out with `--quiet`), as opposed
    /// to the results asked for (a listing).
    const SUMMARY: bool = true;
    /// Writes the human-readable text.
    fn text(&self, out: &mut dyn Write) -> io::Result<()>;
}

/// `v` as JSON text, its keys in the order `keys`, on one line or indented.
pub fn json_text(v: &impl Serialize, keys: Keys, pretty: bool) -> serde_json::Result<String> {
    match (keys, pretty) {
        (Keys::Declared, false) => serde_json::to_string(v),
        (Keys::Declared, true) => serde_json::to_string_pretty(v),
        (Keys::Sorted, false) => serde_json::to_value(v).map(|v| v.to_string()),
        (Keys::Sorted, true) => serde_json::to_string_pretty(&serde_json::to_value(v)?),
    }
}

/// Prints `report` on standard output in the form `form` (the text of a
/// summary not with `--quiet`).
pub fn print(report: &impl Report, form: Form) -> anyhow::Result<()> {
    write_report(&mut io::stdout().lock(), report, form)
}

/// Writes `report` to `out` in the form `form` (see [`print`]).
pub fn write_report<R: Report>(out: &mut dyn Write, report: &R, form: Form) -> anyhow::Result<()> {
    let pretty = match form {
        Form::Text if R::SUMMARY && quiet() => return Ok(()),
        Form::Text => return Ok(report.text(out)?),
        Form::Json => false,
        Form::PrettyJson => true,
    };
    writeln!(out, "{}", json_text(report, R::KEYS, pretty)?)?;
    Ok(())
}

/// Prints `v` as JSON on standard output: an output with no text form, or
/// whose text is printed as the work goes.
pub fn print_json(v: &impl Serialize, keys: Keys, pretty: bool) -> anyhow::Result<()> {
    writeln!(io::stdout().lock(), "{}", json_text(v, keys, pretty)?)?;
    Ok(())
}

/// One record of a streamed JSON array (`ls`, `find`, `diff`) written to
/// `out`: a comma unless it is the `first`, then the record on one line,
/// its keys as declared; an engine output error on failure (so that a
/// listing's callback can return it).
pub fn json_record(
    out: &mut dyn Write,
    first: bool,
    record: &impl Serialize,
) -> tessera::Result<()> {
    let output_error = |source| tessera::Error::Output {
        what: "stdout".into(),
        source,
    };
    let text = serde_json::to_string(record).map_err(|e| output_error(io::Error::other(e)))?;
    let sep = if first { "" } else { "," };
    out.write_all(format!("{sep}{text}").as_bytes())
        .map_err(output_error)
}

/// Bytes in human units (powers of 1024).
pub fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// A ratio (`2.50x`), or why there is none.
pub fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a (nothing stored)".into(), |r| format!("{r:.2}x"))
}

/// Standard output for a data stream (a restore, a dump, a tar stream):
/// buffered by 1 MiB, and when it is a pipe, the pipe widened to 1 MiB
/// (the usual limit for a process, `/proc/sys/fs/pipe-max-size`) so that
/// the writer and its reader switch a sixteenth as often as through the
/// default 64 KiB. A pipe that cannot be widened stays as it is.
pub(crate) fn data_stdout() -> io::BufWriter<io::StdoutLock<'static>> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let fd = io::stdout().as_raw_fd();
        // SAFETY: fstat writes only `st`; F_SETPIPE_SZ only resizes the
        // pipe's buffer (the kernel refuses it on anything but a pipe).
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO {
                libc::fcntl(fd, libc::F_SETPIPE_SZ, 1 << 20);
            }
        }
    }
    io::BufWriter::with_capacity(1 << 20, io::stdout().lock())
}
