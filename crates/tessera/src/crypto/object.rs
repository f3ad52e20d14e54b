//! Encrypted objects (docs/FORMAT.md §23.3): a 32-byte header and the
//! plaintext in 64 KiB segments, each sealed with the repository's AEAD
//! (AES-256-GCM under a key derived for the object from its random salt, or
//! XChaCha20-Poly1305 under the object key with the header's random nonce
//! prefix) under a nonce made of the segment number and a last-segment flag
//! (the STREAM construction), the header and the object's key as associated
//! data.

use crate::backend::ObjectImage;
use crate::error::{Error, Result};
use crate::repo::config::Encryption;
use chacha20poly1305::aead::{AeadInOut, KeyInit};
use chacha20poly1305::{Key, Tag, XChaCha20Poly1305, XNonce};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hkdf::{Salt, HKDF_SHA256};
use zeroize::Zeroizing;

/// Bytes of the header.
pub(crate) const HEADER_LEN: usize = 32;
/// Plaintext bytes of every segment but the last.
pub(crate) const SEGMENT: u64 = 64 * 1024;
/// Bytes of an authentication tag.
const TAG_LEN: usize = 16;
/// Stored bytes of a full segment.
const SEALED_SEGMENT: u64 = SEGMENT + TAG_LEN as u64;
const MAGIC: &[u8; 4] = b"TSEC";
/// Header version of XChaCha20-Poly1305 objects.
const VERSION_XCHACHA: u32 = 1;
/// Header version of AES-256-GCM objects.
const VERSION_AES: u32 = 2;
/// Bytes of the random header field: an XChaCha20 object's nonce prefix,
/// an AES-256-GCM object's key salt.
const RANDOM_LEN: usize = 24;
/// Bytes of the nonce prefix of XChaCha20-Poly1305 objects.
const PREFIX_LEN: usize = 19;
/// HKDF info of the per-object AES-256-GCM key.
const AES_OBJECT_KEY_INFO: &[u8] = b"tessera 2026-11 aes256gcm object key v1";

/// Seals and opens objects with one key, under the repository's cipher.
pub(crate) enum ObjectCipher {
    /// XChaCha20-Poly1305 under the object key itself (header version 1).
    XChaCha(XChaCha20Poly1305),
    /// AES-256-GCM under a key derived for each object (header version 2).
    Aes(Zeroizing<[u8; 32]>),
}

/// The AEAD of one object: the cipher and what its header makes unique.
/// Lives on the stack while one object is sealed or opened (no reason to
/// box the expanded AES key).
#[allow(clippy::large_enum_variant)]
enum ObjectAead<'a> {
    XChaCha(&'a XChaCha20Poly1305, [u8; PREFIX_LEN]),
    Aes(LessSafeKey),
}

/// The error of an object that fails authentication.
pub(crate) fn auth_failed(key: &str) -> Error {
    Error::Authentication {
        object: key.to_string(),
    }
}

impl ObjectCipher {
    /// The cipher of `encryption` with the 32-byte `key`; `None` for
    /// [`Encryption::None`].
    pub(crate) fn new(encryption: Encryption, key: &Zeroizing<[u8; 32]>) -> Option<Self> {
        match encryption {
            Encryption::None => None,
            Encryption::XChaCha20Poly1305 => Some(ObjectCipher::XChaCha(XChaCha20Poly1305::new(
                &Key::from(**key),
            ))),
            Encryption::Aes256Gcm => Some(ObjectCipher::Aes(key.clone())),
        }
    }

    /// The header version of the objects this cipher writes.
    fn version(&self) -> u32 {
        match self {
            ObjectCipher::XChaCha(_) => VERSION_XCHACHA,
            ObjectCipher::Aes(_) => VERSION_AES,
        }
    }

    /// The AEAD of the object with `header` (of this cipher's version).
    fn object_aead(&self, key: &str, header: &[u8; HEADER_LEN]) -> Result<ObjectAead<'_>> {
        let random = &header[8..8 + RANDOM_LEN];
        match self {
            ObjectCipher::XChaCha(aead) => {
                let mut prefix = [0u8; PREFIX_LEN];
                prefix.copy_from_slice(&random[..PREFIX_LEN]);
                Ok(ObjectAead::XChaCha(aead, prefix))
            }
            ObjectCipher::Aes(master) => {
                let prk = Salt::new(HKDF_SHA256, random).extract(master.as_slice());
                let okm = prk
                    .expand(&[AES_OBJECT_KEY_INFO], &AES_256_GCM)
                    .map_err(|_| Error::Pipeline(format!("{key}: key derivation failed")))?;
                Ok(ObjectAead::Aes(LessSafeKey::new(UnboundKey::from(okm))))
            }
        }
    }

    /// The concatenation of `parts` as the encrypted object `key`.
    pub(crate) fn seal(&self, key: &str, parts: &[&[u8]]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.seal_append(key, parts, &mut out)?;
        Ok(out)
    }

    /// Appends the concatenation of `parts`, sealed as the encrypted object
    /// `key` ([`sealed_len`] bytes), to `out`: each part is copied once
    /// and encrypted where it lands.
    pub(crate) fn seal_append(&self, key: &str, parts: &[&[u8]], out: &mut Vec<u8>) -> Result<()> {
        let plain_len: usize = parts.iter().map(|p| p.len()).sum();
        out.reserve(sealed_len(plain_len as u64) as usize);
        let mut image = SealImage::new(out);
        for part in parts {
            image.append(part);
        }
        self.seal_image(key, image)
    }

    /// Seals the plaintext appended to `image` as the encrypted object
    /// `key`: writes the header, encrypts every segment where it lies and
    /// puts its tag in the gap left after it.
    pub(crate) fn seal_image(&self, key: &str, image: SealImage<'_>) -> Result<()> {
        let SealImage { out, start, plain } = image;
        let mut header = [0u8; HEADER_LEN];
        header[..4].copy_from_slice(MAGIC);
        header[4..8].copy_from_slice(&self.version().to_le_bytes());
        let random = match self {
            ObjectCipher::XChaCha(_) => PREFIX_LEN,
            ObjectCipher::Aes(_) => RANDOM_LEN,
        };
        crate::crypto::random_bytes(&mut header[8..8 + random])?;
        let aead = self.object_aead(key, &header)?;
        out[start..start + HEADER_LEN].copy_from_slice(&header);
        // The last segment's tag gap, unless it was left when the segment filled.
        if plain == 0 || !(plain as u64).is_multiple_of(SEGMENT) {
            out.extend_from_slice(&[0; TAG_LEN]);
        }
        let aad = associated_data(&header, key);
        let segments = segment_count(plain as u64);
        for i in 0..segments {
            let text = start + HEADER_LEN + (i * SEALED_SEGMENT) as usize;
            let len = (plain - (i * SEGMENT) as usize).min(SEGMENT as usize);
            let tag = aead
                .seal(i, i + 1 == segments, &aad, &mut out[text..text + len])
                .ok_or_else(|| Error::Pipeline(format!("{key}: encryption failed")))?;
            out[text + len..text + len + TAG_LEN].copy_from_slice(&tag);
        }
        Ok(())
    }

    /// The plaintext of the whole encrypted object `key`.
    pub(crate) fn open(&self, key: &str, object: &[u8]) -> Result<Vec<u8>> {
        self.open_owned(key, object.to_vec())
    }

    /// The plaintext of the whole encrypted object `key`, decrypted in the
    /// buffer `object` was read into (no second buffer, no copy beyond
    /// moving each segment over the gaps of the header and tags).
    pub(crate) fn open_owned(&self, key: &str, mut object: Vec<u8>) -> Result<Vec<u8>> {
        let header: [u8; HEADER_LEN] = object
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| auth_failed(key))?;
        self.open_in_place(key, &header, 0, &mut object, HEADER_LEN, true)?;
        Ok(object)
    }

    /// Opens the consecutive sealed segments at `buf[body..]`, the first of
    /// which is segment `first`, of object `key` with `header`, leaving
    /// their plaintext at the start of `buf` (truncated to it). `to_end`:
    /// the last of them is the object's last segment. On failure `buf`
    /// holds garbage.
    pub(crate) fn open_in_place(
        &self,
        key: &str,
        header: &[u8],
        first: u64,
        buf: &mut Vec<u8>,
        body: usize,
        to_end: bool,
    ) -> Result<()> {
        let header: &[u8; HEADER_LEN] = header.try_into().map_err(|_| auth_failed(key))?;
        if &header[..4] != MAGIC {
            return Err(Error::corrupt(key, "not an encrypted Tessera object"));
        }
        let version = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if version != self.version() {
            if matches!(version, VERSION_XCHACHA | VERSION_AES) {
                return Err(Error::corrupt(
                    key,
                    format!("encrypted with cipher version {version}, not the repository's"),
                ));
            }
            return Err(Error::UnsupportedVersion {
                object: key.to_string(),
                found: version,
                supported: self.version(),
            });
        }
        let aead = self.object_aead(key, header)?;
        let aad = associated_data(header, key);
        let sealed = buf.len().saturating_sub(body);
        let pieces = sealed.div_ceil(SEALED_SEGMENT as usize);
        if to_end && pieces == 0 {
            return Err(auth_failed(key));
        }
        // Segment n moves from `body + n * SEALED_SEGMENT` down to
        // `n * SEGMENT`: never onto a later segment nor onto its own tag.
        let mut plain = 0;
        for n in 0..pieces {
            let src = body + n * SEALED_SEGMENT as usize;
            let end = (src + SEALED_SEGMENT as usize).min(buf.len());
            let text = (end - src)
                .checked_sub(TAG_LEN)
                .ok_or_else(|| auth_failed(key))?;
            let tag: [u8; TAG_LEN] = buf[src + text..end]
                .try_into()
                .map_err(|_| auth_failed(key))?;
            let last = to_end && n + 1 == pieces;
            aead.open(
                first + n as u64,
                last,
                &aad,
                &tag,
                &mut buf[plain..src + text],
                src - plain,
            )
            .ok_or_else(|| auth_failed(key))?;
            plain += text;
        }
        buf.truncate(plain);
        Ok(())
    }
}

/// The plaintext of an object being sealed, appended to a buffer where
/// the sealed object holds it: after room for the header, with a gap for
/// the tag after every segment. [`ObjectCipher::seal_image`] then seals it
/// in place.
pub(crate) struct SealImage<'a> {
    out: &'a mut Vec<u8>,
    /// Where the object starts in `out`.
    start: usize,
    /// Plaintext bytes appended.
    plain: usize,
}

impl<'a> SealImage<'a> {
    /// An empty object appended to `out`.
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER_LEN]);
        SealImage {
            out,
            start,
            plain: 0,
        }
    }

    /// Where plaintext byte `offset` lies in `out`.
    fn position(&self, offset: usize) -> usize {
        self.start + HEADER_LEN + offset + TAG_LEN * (offset / SEGMENT as usize)
    }
}

impl crate::backend::ObjectImage for SealImage<'_> {
    fn append(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = SEGMENT as usize - self.plain % SEGMENT as usize;
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.out.extend_from_slice(now);
            self.plain += now.len();
            if self.plain.is_multiple_of(SEGMENT as usize) {
                // The segment is full: leave the gap of its tag.
                self.out.extend_from_slice(&[0; TAG_LEN]);
            }
            bytes = rest;
        }
    }

    fn overwrite(&mut self, mut offset: usize, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = SEGMENT as usize - offset % SEGMENT as usize;
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            let at = self.position(offset);
            self.out[at..at + now.len()].copy_from_slice(now);
            offset += now.len();
            bytes = rest;
        }
    }

    fn len(&self) -> usize {
        self.plain
    }
}

impl ObjectAead<'_> {
    /// Encrypts segment `segment` (`last`: the object's last) in place; its tag.
    fn seal(&self, segment: u64, last: bool, aad: &[u8], text: &mut [u8]) -> Option<[u8; TAG_LEN]> {
        match self {
            ObjectAead::XChaCha(aead, prefix) => aead
                .encrypt_inout_detached(&xchacha_nonce(prefix, segment, last), aad, text.into())
                .ok()
                .map(Into::into),
            ObjectAead::Aes(aead) => aead
                .seal_in_place_separate_tag(aes_nonce(segment, last), Aad::from(aad), text)
                .ok()
                .and_then(|tag| tag.as_ref().try_into().ok()),
        }
    }

    /// Decrypts segment `segment`, whose ciphertext is `in_out[shift..]`
    /// and whose tag is `tag`, into `in_out[..in_out.len() - shift]`;
    /// `None` if it fails authentication.
    fn open(
        &self,
        segment: u64,
        last: bool,
        aad: &[u8],
        tag: &[u8; TAG_LEN],
        in_out: &mut [u8],
        shift: usize,
    ) -> Option<()> {
        match self {
            ObjectAead::XChaCha(aead, prefix) => {
                in_out.copy_within(shift.., 0);
                let text = in_out.len() - shift;
                aead.decrypt_inout_detached(
                    &xchacha_nonce(prefix, segment, last),
                    aad,
                    (&mut in_out[..text]).into(),
                    &Tag::from(*tag),
                )
                .ok()
            }
            ObjectAead::Aes(aead) => aead
                .open_in_place_separate_tag(
                    aes_nonce(segment, last),
                    Aad::from(aad),
                    ring::aead::Tag::from(*tag),
                    in_out,
                    shift..,
                )
                .ok()
                .map(|_| ()),
        }
    }
}

/// Number of segments of a plaintext of `len` bytes (an empty one has one).
fn segment_count(len: u64) -> u64 {
    len.div_ceil(SEGMENT).max(1)
}

/// Size of the encrypted object of a plaintext of `plain` bytes.
pub(crate) fn sealed_len(plain: u64) -> u64 {
    HEADER_LEN as u64 + plain + segment_count(plain) * TAG_LEN as u64
}

/// Size of the plaintext of an encrypted object of `stored` bytes; `None`
/// if no encrypted object has that size.
pub(crate) fn plaintext_len(stored: u64) -> Option<u64> {
    let body = stored.checked_sub(HEADER_LEN as u64)?;
    let segments = body.div_ceil(SEALED_SEGMENT);
    let last = body - (segments.checked_sub(1)?) * SEALED_SEGMENT;
    (last >= TAG_LEN as u64).then(|| body - segments * TAG_LEN as u64)
}

/// The stored bytes holding plaintext `offset .. offset + len` (`len` > 0):
/// the first segment's number, and the stored offset and length to read,
/// one byte beyond the last segment needed, which tells whether that
/// segment is the object's last.
pub(crate) fn sealed_span(offset: u64, len: u64) -> (u64, u64, u64) {
    let first = offset / SEGMENT;
    let last = (offset.saturating_add(len) - 1) / SEGMENT;
    let start = HEADER_LEN as u64 + first * SEALED_SEGMENT;
    (first, start, (last - first + 1) * SEALED_SEGMENT + 1)
}

fn associated_data(header: &[u8; HEADER_LEN], key: &str) -> Vec<u8> {
    [header.as_slice(), key.as_bytes()].concat()
}

fn xchacha_nonce(prefix: &[u8; PREFIX_LEN], segment: u64, last: bool) -> XNonce {
    let mut n = [0u8; 24];
    n[..PREFIX_LEN].copy_from_slice(prefix);
    // Segment numbers fit in 32 bits: objects are far below 256 TiB.
    n[PREFIX_LEN..PREFIX_LEN + 4].copy_from_slice(&(segment as u32).to_be_bytes());
    n[23] = u8::from(last);
    XNonce::from(n)
}

/// The nonce of AES-256-GCM segment `segment`: unique under the object's
/// own key.
fn aes_nonce(segment: u64, last: bool) -> Nonce {
    let mut n = [0u8; 12];
    n[3..11].copy_from_slice(&segment.to_be_bytes());
    n[11] = u8::from(last);
    Nonce::assume_unique_for_key(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One cipher of each kind.
    fn ciphers() -> Vec<ObjectCipher> {
        [Encryption::Aes256Gcm, Encryption::XChaCha20Poly1305]
            .into_iter()
            .filter_map(|e| ObjectCipher::new(e, &Zeroizing::new([7; 32])))
            .collect()
    }

    #[test]
    fn round_trips_and_sizes() {
        for c in ciphers() {
            for len in [0usize, 1, 65535, 65536, 65537, 200_000] {
                let data: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
                let (a, b) = data.split_at(len / 3);
                let sealed = c.seal("k/x", &[a, b]).unwrap();
                assert_eq!(plaintext_len(sealed.len() as u64), Some(len as u64));
                assert_eq!(c.open("k/x", &sealed).unwrap(), data);
                assert!(matches!(
                    c.open("k/y", &sealed),
                    Err(Error::Authentication { object }) if object == "k/y"
                ));
            }
        }
        assert_eq!(plaintext_len(40), None);
        assert_eq!(plaintext_len(32 + 65552 + 3), None);
    }

    #[test]
    fn images_are_sealed_in_place_with_overwrites_across_segments() {
        for c in ciphers() {
            for len in [0usize, 10, 65536, 65537, 200_000] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                let mut out = vec![9u8; 5];
                let mut image = SealImage::new(&mut out);
                image.append(&vec![0; len.min(70_000)]);
                for piece in data[len.min(70_000)..].chunks(3001) {
                    image.append(piece);
                }
                assert_eq!(image.len(), len);
                image.overwrite(0, &data[..len.min(70_000)]);
                c.seal_image("o", image).unwrap();
                assert_eq!(out[..5], [9; 5]);
                assert_eq!(out.len() - 5, sealed_len(len as u64) as usize);
                assert_eq!(c.open("o", &out[5..]).unwrap(), data);
            }
        }
    }

    #[test]
    fn every_flip_and_truncation_fails() {
        for c in ciphers() {
            let data = vec![5u8; 70_000];
            let sealed = c.seal("o", &[&data]).unwrap();
            for i in (0..sealed.len())
                .step_by(997)
                .chain([0, 9, 31, sealed.len() - 1])
            {
                let mut bad = sealed.clone();
                bad[i] ^= 0x20;
                assert!(c.open("o", &bad).is_err(), "flip at {i}");
            }
            // Cut after the first segment: the remaining one is not flagged last.
            let cut = HEADER_LEN + SEALED_SEGMENT as usize;
            assert!(c.open("o", &sealed[..cut]).is_err());
        }
    }

    #[test]
    fn two_seals_differ() {
        for c in ciphers() {
            assert_ne!(
                c.seal("o", &[b"same"]).unwrap(),
                c.seal("o", &[b"same"]).unwrap()
            );
        }
    }

    #[test]
    fn an_object_of_the_other_cipher_is_refused_by_name() {
        let [aes, xchacha] = <[ObjectCipher; 2]>::try_from(ciphers()).ok().unwrap();
        let sealed = xchacha.seal("snapshots/1", &[b"data"]).unwrap();
        let err = aes.open("snapshots/1", &sealed).unwrap_err().to_string();
        assert!(
            err.contains("snapshots/1") && err.contains("cipher version 1"),
            "{err}"
        );
        let sealed = aes.seal("snapshots/1", &[b"data"]).unwrap();
        assert!(xchacha.open("snapshots/1", &sealed).is_err());
    }

    #[test]
    fn segments_open_from_the_middle() {
        for c in ciphers() {
            let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            let sealed = c.seal("o", &[&data]).unwrap();
            let header = &sealed[..HEADER_LEN];
            // Segments 2..=4 (the last), read on their own.
            let start = HEADER_LEN + 2 * SEALED_SEGMENT as usize;
            let mut buf = sealed[start..].to_vec();
            c.open_in_place("o", header, 2, &mut buf, 0, true).unwrap();
            assert_eq!(buf, data[2 * SEGMENT as usize..]);
            // Segment 1 claimed as the last fails.
            let one = HEADER_LEN + SEALED_SEGMENT as usize;
            let mut buf = sealed[one..one + SEALED_SEGMENT as usize].to_vec();
            assert!(c.open_in_place("o", header, 1, &mut buf, 0, true).is_err());
        }
    }
}
