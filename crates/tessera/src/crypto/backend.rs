//! The encrypting storage layer: every object but the key files and the
//! `config` header is sealed on write and authenticated on read, by
//! segments, so that a ranged read decrypts only what it touches.

use super::object::{self, auth_failed, ObjectCipher, SealImage, HEADER_LEN};
use super::KEYS_DIR;
use crate::backend::buffers::BufferPool;
use crate::backend::{
    with_fill_buffer, write_collected, Backend, Layer, ObjectImage, WriteMode, CONFIG_KEY,
};
use crate::error::Result;
use std::io::Write;
use std::sync::Arc;

/// A backend whose objects are encrypted in `inner` (docs/FORMAT.md §23.3).
/// Keys, sizes and ranges are those of the plaintext objects.
pub struct Encrypting {
    inner: Box<dyn Backend>,
    cipher: ObjectCipher,
    /// The buffers whole objects are opened in ([`ObjectStore::read_shared`](crate::backend::ObjectStore::read_shared)),
    /// reused: reading container after container decrypts into warm
    /// memory instead of faulting in (and having the kernel zero) fresh
    /// pages for every one.
    opened: Arc<BufferPool>,
}

/// Buffers of opened objects kept for reuse, at most.
const KEEP_OPENED: usize = 8;

impl Encrypting {
    /// Encrypts the objects of `inner` with `cipher`.
    pub(crate) fn new(inner: Box<dyn Backend>, cipher: ObjectCipher) -> Self {
        Encrypting {
            inner,
            cipher,
            opened: BufferPool::new(KEEP_OPENED),
        }
    }

    /// `len` plaintext bytes of `key` from `offset`, from the stored
    /// ranges `read` returns (the sealed segments covering them).
    fn open_range(
        &self,
        key: &str,
        offset: u64,
        len: u64,
        read: impl Fn(&str, u64, u64) -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        if is_plain(key) {
            return read(key, offset, len);
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let (first, start, span) = object::sealed_span(offset, len);
        // The sealed segments are decrypted where they were read: at
        // `buf[body..]`, after the header when it was read with them.
        let (header, mut buf, body) = if first == 0 {
            let stored = read(key, 0, start + span)?;
            let header = stored.get(..HEADER_LEN).ok_or_else(|| auth_failed(key))?;
            (header.to_vec(), stored, HEADER_LEN)
        } else {
            let header = read(key, 0, HEADER_LEN as u64)?;
            (header, read(key, start, span)?, 0)
        };
        let sealed = buf.len() - body;
        if sealed == 0 {
            // The range starts at or beyond the end: nothing to return
            // (a shorter read than asked is how callers see truncation).
            return Ok(Vec::new());
        }
        // The extra byte read past the last needed segment is there iff
        // that segment is not the object's last.
        let needed = (span - 1) as usize;
        let to_end = sealed <= needed;
        buf.truncate(body + sealed.min(needed));
        self.cipher
            .open_in_place(key, &header, first, &mut buf, body, to_end)?;
        let skip = ((offset - first * object::SEGMENT) as usize).min(buf.len());
        let end = skip.saturating_add(len as usize).min(buf.len());
        buf.truncate(end);
        buf.drain(..skip);
        Ok(buf)
    }
}

impl Encrypting {
    /// Seals the plaintext `fill` appends (about `len_hint` bytes) as
    /// object `key`, in place in this thread's object buffer, and hands
    /// the sealed object to `write`.
    fn sealed(
        &self,
        key: &str,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut dyn ObjectImage) -> Result<()>,
        write: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let capacity = object::sealed_len(len_hint as u64) as usize;
        with_fill_buffer(capacity, |buf| {
            let mut image = SealImage::new(buf.vec_mut());
            fill(&mut image)?;
            self.cipher.seal_image(key, image)?;
            write(buf.as_slice())
        })
    }

    /// Seals the concatenation of `parts` as object `key` and hands it to `write`.
    fn sealed_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        write: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let len = parts.iter().map(|p| p.len()).sum();
        let mut fill = |image: &mut dyn ObjectImage| {
            parts.iter().for_each(|p| image.append(p));
            Ok(())
        };
        self.sealed(key, len, &mut fill, write)
    }
}

/// The objects stored unencrypted: the `config` header and the key files.
fn is_plain(key: &str) -> bool {
    key == CONFIG_KEY
        || key
            .strip_prefix(KEYS_DIR)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Seals and opens the bytes of every object but the plain ones; deletes,
/// listings, existence checks, locks and hints go to the inner backend.
impl Layer for Encrypting {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    fn read(&self, key: &str) -> Result<Vec<u8>> {
        let stored = self.inner.read(key)?;
        match is_plain(key) {
            true => Ok(stored),
            false => self.cipher.open_owned(key, stored),
        }
    }

    /// The stored object as the inner backend shares it (a local file is
    /// mapped, not read), opened in a reused buffer.
    fn read_shared(&self, key: &str) -> Result<bytes::Bytes> {
        let stored = self.inner.read_shared(key)?;
        if is_plain(key) {
            return Ok(stored);
        }
        let header = stored.get(..HEADER_LEN).ok_or_else(|| auth_failed(key))?;
        self.opened.lend(stored.len(), |buf| {
            buf.extend_from_slice(&stored);
            self.cipher
                .open_in_place(key, header, 0, buf, HEADER_LEN, true)
        })
    }

    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.open_range(key, offset, len, |k, o, l| self.inner.read_range(k, o, l))
    }

    /// The stored ranges are read through the inner backend's cache.
    fn read_range_cached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.open_range(key, offset, len, |k, o, l| {
            self.inner.read_range_cached(k, o, l)
        })
    }

    fn size(&self, key: &str) -> Result<u64> {
        let stored = self.inner.size(key)?;
        match is_plain(key) {
            true => Ok(stored),
            false => object::plaintext_len(stored).ok_or_else(|| auth_failed(key)),
        }
    }

    fn write(&self, key: &str, data: &[u8]) -> Result<()> {
        Layer::write_parts(self, key, &[data])
    }

    fn write_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        match is_plain(key) {
            true => self.inner.write_parts(key, parts),
            false => self.sealed_parts(key, parts, |sealed| self.inner.write_parts(key, &[sealed])),
        }
    }

    fn write_new(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        match is_plain(key) {
            true => self.inner.write_new(key, parts),
            false => self.sealed_parts(key, parts, |sealed| self.inner.write_new(key, &[sealed])),
        }
    }

    /// The plaintext is appended where the sealed object holds it and
    /// encrypted there: copied once.
    fn write_new_filled(
        &self,
        key: &str,
        len_hint: usize,
        fill: &mut dyn FnMut(&mut dyn ObjectImage) -> Result<()>,
    ) -> Result<()> {
        match is_plain(key) {
            true => self.inner.write_new_filled(key, len_hint, fill),
            false => self.sealed(key, len_hint, fill, |sealed| {
                self.inner.write_new(key, &[sealed])
            }),
        }
    }

    fn transforms_objects(&self) -> bool {
        true
    }

    /// The collected bytes are sealed as [`Layer::write`] and
    /// [`Layer::write_new`] seal them (the inner backend's streaming would
    /// store them in the clear).
    fn write_streamed(
        &self,
        key: &str,
        mode: WriteMode,
        produce: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
    ) -> Result<u64> {
        write_collected(produce, |data| match mode {
            WriteMode::Replace => Layer::write(self, key, data),
            WriteMode::CreateNew => Layer::write_new(self, key, &[data]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testing::assert_forwards_locks_and_hints;
    use crate::backend::Local;
    use crate::error::Error;
    use zeroize::Zeroizing;

    fn setup() -> (tempfile::TempDir, Encrypting) {
        let dir = tempfile::tempdir().unwrap();
        let cipher = ObjectCipher::new(
            crate::repo::config::Encryption::Aes256Gcm,
            &Zeroizing::new([3; 32]),
        )
        .unwrap();
        let enc = Encrypting::new(Box::new(Local::new(dir.path())), cipher);
        (dir, enc)
    }

    #[test]
    fn filled_objects_are_sealed_in_place() {
        let (dir, enc) = setup();
        let local: &dyn Backend = &Local::new(dir.path());
        assert!(enc.transforms_objects() && !local.transforms_objects());
        let mut b = crate::layout::container::Builder::new(9, 1 << 20)
            .with_encoding(crate::format::compression::Compression::Auto)
            .holding();
        let text = b"abcabcabc".repeat(20_000);
        let random = crate::chunker::pseudo_random(150_000, 1);
        for c in [&text, &random] {
            b.push(crate::fingerprint::FingerprintAlgo::Blake3.hash(c), c);
        }
        let (counts, _) = b.write_new(&enc).unwrap();
        assert_eq!((counts.compressed, counts.raw), (1, 1));
        let key = crate::layout::container::key(9);
        let c = crate::layout::container::Container::parse(9, enc.read(&key).unwrap()).unwrap();
        assert_eq!(c.entry(0).unwrap().as_ref(), &text[..]);
        assert_eq!(c.plain(1), Some(&random[..]));
        // No plaintext on disk; a flipped stored byte fails authentication.
        let path = dir.path().join(&key);
        let mut stored = std::fs::read(&path).unwrap();
        assert!(!stored.windows(64).any(|w| w == &random[1000..1064]));
        let at = stored.len() / 2;
        stored[at] ^= 4;
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, &stored).unwrap();
        assert!(matches!(enc.read(&key), Err(Error::Authentication { .. })));
    }

    #[test]
    fn ranges_match_the_plaintext() {
        let (_dir, enc) = setup();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        enc.write_new("containers/x", &[&data[..1000], &data[1000..]])
            .unwrap();
        assert_eq!(enc.size("containers/x").unwrap(), data.len() as u64);
        assert_eq!(enc.read("containers/x").unwrap(), data);
        let seg = object::SEGMENT;
        for (off, len) in [
            (0, 1),
            (0, 64),
            (5, seg),
            (seg - 1, 2),
            (seg, seg),
            (2 * seg + 7, 100_000),
            (299_990, 100),
            (300_000, 5),
            (400_000, 5),
        ] {
            let got = enc.read_range("containers/x", off, len).unwrap();
            let from = (off as usize).min(data.len());
            let to = (off + len).min(data.len() as u64) as usize;
            assert_eq!(got, &data[from..to], "range {off}+{len}");
        }
    }

    #[test]
    fn damage_and_swaps_fail_authentication() {
        let (dir, enc) = setup();
        enc.write("recipes/a", b"recipe a").unwrap();
        enc.write("recipes/b", b"recipe b").unwrap();
        std::fs::copy(dir.path().join("recipes/a"), dir.path().join("recipes/b")).unwrap();
        assert!(matches!(
            enc.read("recipes/b"),
            Err(Error::Authentication { object }) if object == "recipes/b"
        ));
        let big = vec![1u8; 200_000];
        enc.write("state", &big).unwrap();
        let path = dir.path().join("state");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[100_000] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(enc.read_range("state", 0, 10).is_ok());
        assert!(matches!(
            enc.read_range("state", 70_000, 10),
            Err(Error::Authentication { .. })
        ));
        // Truncated to whole segments: the new last segment is not flagged last.
        bytes[100_000] ^= 1;
        bytes.truncate(HEADER_LEN + 2 * 65552);
        std::fs::write(&path, &bytes).unwrap();
        assert!(enc.read_range("state", 0, 10).is_ok());
        assert!(enc.read_range("state", 70_000, 10).is_err());
        assert!(enc.read("state").is_err());
    }

    #[test]
    fn config_and_key_files_stay_plain() {
        let (dir, enc) = setup();
        enc.write("keys/0123456789abcdef", b"plain").unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("keys/0123456789abcdef")).unwrap(),
            b"plain"
        );
        assert!(is_plain("config") && !is_plain("keysx/a") && !is_plain("index/exact"));
    }

    /// However an object is written, what is stored is sealed (no
    /// plaintext) and reads back as the plaintext: no write path reaches
    /// the inner backend unsealed.
    #[test]
    fn every_write_path_seals() {
        let (dir, enc) = setup();
        let enc: &dyn Backend = &enc;
        let text = |i: u8| format!("secret number {i} ").repeat(500).into_bytes();
        enc.write("index/1", &text(1)).unwrap();
        enc.write_parts("index/2", &[&text(2)[..10], &text(2)[10..]])
            .unwrap();
        enc.write_new("index/3", &[&text(3)]).unwrap();
        let mut fill = |image: &mut dyn ObjectImage| {
            image.append(&text(4));
            Ok(())
        };
        enc.write_new_filled("index/4", 100, &mut fill).unwrap();
        for (i, mode) in [(5, WriteMode::Replace), (6, WriteMode::CreateNew)] {
            let mut produce =
                |out: &mut dyn Write| out.write_all(&text(i)).map_err(|e| Error::io("test", e));
            let len = enc.write_streamed(&format!("index/{i}"), mode, &mut produce);
            assert_eq!(len.unwrap(), text(i).len() as u64);
        }
        for i in 1..=6 {
            let key = format!("index/{i}");
            let stored = std::fs::read(dir.path().join(&key)).unwrap();
            assert!(
                !stored.windows(16).any(|w| w == &text(i)[..16]),
                "{key} stored in the clear"
            );
            assert_eq!(enc.read(&key).unwrap(), text(i), "{key}");
            assert_eq!(enc.size(&key).unwrap(), text(i).len() as u64);
        }
    }

    #[test]
    fn locks_and_hints_reach_the_inner_backend() {
        let cipher = ObjectCipher::new(
            crate::repo::config::Encryption::Aes256Gcm,
            &Zeroizing::new([3; 32]),
        )
        .unwrap();
        assert_forwards_locks_and_hints(|inner| Box::new(Encrypting::new(inner, cipher)));
    }
}
