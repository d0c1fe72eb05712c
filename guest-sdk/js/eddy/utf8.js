// UTF-8 without relying on TextEncoder/TextDecoder: QuickJS has neither, and most keys and
// field names are ASCII, which the loops below handle without a temporary string.

const encoder = typeof TextEncoder === "function" ? new TextEncoder() : null;
const decoder = typeof TextDecoder === "function" ? new TextDecoder("utf-8", { fatal: true }) : null;

/** `text` as UTF-8 bytes. */
export function encode(text) {
  const n = text.length;
  let ascii = true;
  for (let i = 0; i < n; i++) {
    if (text.charCodeAt(i) > 0x7f) {
      ascii = false;
      break;
    }
  }
  if (ascii) {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = text.charCodeAt(i);
    return out;
  }
  return encoder ? encoder.encode(text) : encodePortable(text);
}

/** What TextEncoder writes, in plain JavaScript (for engines without it). */
export function encodePortable(text) {
  const n = text.length;
  const out = [];
  for (let i = 0; i < n; i++) {
    let c = text.codePointAt(i);
    if (c > 0xffff) i++;
    else if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd; // a lone surrogate, as TextEncoder writes it
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
  }
  return Uint8Array.from(out);
}

/** ASCII bytes `bytes[start, end)` as text: one call per 4 KiB, as interpreters pay per call
 * rather than per character (and an engine limits how many arguments a call takes). */
export function ascii(bytes, start, end) {
  if (end - start <= 4096) return String.fromCharCode.apply(null, bytes.subarray(start, end));
  let s = "";
  for (let at = start; at < end; at += 4096) s += String.fromCharCode.apply(null, bytes.subarray(at, Math.min(end, at + 4096)));
  return s;
}

/** The text UTF-8 bytes `bytes[start, end)` hold; malformed bytes throw. */
export function decode(bytes, start = 0, end = bytes.length) {
  let i = start;
  while (i < end && bytes[i] < 0x80) i++;
  const s = ascii(bytes, start, i);
  if (i === end) return s;
  if (!decoder) return s + decodePortable(bytes, i, end);
  try {
    return s + decoder.decode(bytes.subarray(i, end));
  } catch {
    throw new TypeError(`malformed UTF-8 after byte ${i}`);
  }
}

/** What a fatal TextDecoder reads, in plain JavaScript (for engines without it). */
export function decodePortable(bytes, start = 0, end = bytes.length) {
  let s = "";
  let i = start;
  while (i < end) {
    const b = bytes[i];
    let c;
    let more;
    if (b < 0x80) {
      c = b;
      more = 0;
    } else if (b >= 0xc2 && b < 0xe0) {
      c = b & 31;
      more = 1;
    } else if (b >= 0xe0 && b < 0xf0) {
      c = b & 15;
      more = 2;
    } else if (b >= 0xf0 && b < 0xf5) {
      c = b & 7;
      more = 3;
    } else {
      throw new TypeError(`malformed UTF-8 at byte ${i}`);
    }
    for (let k = 1; k <= more; k++) {
      if (i + k >= end || (bytes[i + k] & 0xc0) !== 0x80) throw new TypeError(`malformed UTF-8 at byte ${i}`);
      const next = bytes[i + k];
      c = (c << 6) | (next & 63);
    }
    if ((more === 2 && (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))) || (more === 3 && (c < 0x10000 || c > 0x10ffff))) {
      throw new TypeError(`malformed UTF-8 at byte ${i}`);
    }
    s += String.fromCodePoint(c);
    i += more + 1;
  }
  return s;
}
