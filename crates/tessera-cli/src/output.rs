//! What the commands share for printing: human units, ratios, standard
//! output for data streams and the exit status of incomplete work.

use std::io;

/// Exit status of a backup (or restore, repair, find) that committed but left out objects it could not read.
pub const EXIT_INCOMPLETE: u8 = 3;

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
