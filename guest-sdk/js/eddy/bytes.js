// Little-endian tables as the WIT packs them. Interpreted engines (QuickJS, SpiderMonkey
// without a JIT) pay per call, so tables are read and written as Uint32Arrays (one indexed
// access per field; WebAssembly is little-endian) and 64-bit fields as two 32-bit halves,
// with no BigInt on the common path.

const TWO32 = 4294967296;

export function view(bytes) {
  return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/** `bytes` (a table of u32s) as a Uint32Array, copied first if it is not 4-byte aligned. */
export function words(bytes) {
  const aligned = bytes.byteOffset % 4 === 0 ? bytes : bytes.slice();
  return new Uint32Array(aligned.buffer, aligned.byteOffset, aligned.length >>> 2);
}

/** The s64 whose halves are words `lo` and `lo + 1` of `w`, as a Number (times in ms fit). */
export function readI64(w, lo) {
  return (w[lo + 1] | 0) * TWO32 + w[lo];
}

/** A growable byte buffer, for the tables and data an SDK hands back in one crossing. */
export class Writer {
  constructor(capacity = 1024) {
    this.bytes = new Uint8Array(capacity);
    this.words = new Uint32Array(this.bytes.buffer);
    this.length = 0;
  }

  reserve(extra) {
    const need = this.length + extra;
    if (need <= this.bytes.length) return;
    let size = this.bytes.length * 2;
    while (size < need) size *= 2;
    const grown = new Uint8Array(size);
    grown.set(this.bytes.subarray(0, this.length));
    this.bytes = grown;
    this.words = new Uint32Array(grown.buffer);
  }

  append(part) {
    this.reserve(part.length);
    this.bytes.set(part, this.length);
    this.length += part.length;
  }

  /** Bytes `from[start, end)`. */
  copy(from, start, end) {
    const n = end - start;
    this.reserve(n);
    const b = this.bytes;
    let at = this.length;
    // Short runs (keys) are cheaper copied by hand than through a subarray.
    if (n <= 16) for (let i = start; i < end; i++) b[at++] = from[i];
    else b.set(from.subarray(start, end), at);
    this.length += n;
  }

  /** Writes `text` if it is ASCII needing no JSON escape, quoted when `quote`; else false. */
  plain(text, quote) {
    const n = text.length;
    if (this.length + n + 2 > this.bytes.length) this.reserve(n + 2);
    const b = this.bytes;
    let at = this.length;
    if (quote) b[at++] = 0x22;
    for (let i = 0; i < n; i++) {
      const c = text.charCodeAt(i);
      if (c < 0x20 || c > 0x7e || c === 0x22 || c === 0x5c) return false;
      b[at++] = c;
    }
    if (quote) b[at++] = 0x22;
    this.length = at;
    return true;
  }

  /** A u32; tables are written whole words at a time, so their writes stay aligned. */
  u32(n) {
    if (this.length % 4 === 0) {
      this.reserve(4);
      this.words[this.length >>> 2] = n;
    } else {
      this.reserve(4);
      const b = this.bytes;
      const at = this.length;
      b[at] = n & 255;
      b[at + 1] = (n >>> 8) & 255;
      b[at + 2] = (n >>> 16) & 255;
      b[at + 3] = n >>> 24;
    }
    this.length += 4;
  }

  /** Four u32s at an aligned length (a state write's table entry). */
  words4(a, b, c, d) {
    if (this.length + 16 > this.bytes.length) this.reserve(16);
    const w = this.words;
    const at = this.length >>> 2;
    w[at] = a;
    w[at + 1] = b;
    w[at + 2] = c;
    w[at + 3] = d;
    this.length += 16;
  }

  /** A record's 32-byte table entry (`batch.records`) at an aligned length. */
  record(ko, kl, vo, vl, timestamp, last) {
    if (this.length + 32 > this.bytes.length) this.reserve(32);
    const w = this.words;
    const at = this.length >>> 2;
    w[at] = ko;
    w[at + 1] = kl;
    w[at + 2] = vo;
    w[at + 3] = vl;
    if (timestamp === null || timestamp === undefined) {
      w[at + 4] = 0;
      w[at + 5] = 0;
      w[at + 6] = 0;
    } else {
      const hi = Math.floor(timestamp / TWO32);
      w[at + 4] = timestamp - hi * TWO32;
      w[at + 5] = hi >>> 0;
      w[at + 6] = 1;
    }
    w[at + 7] = last;
    this.length += 32;
  }

  i64(n) {
    const hi = Math.floor(n / TWO32);
    this.u32(n - hi * TWO32);
    this.u32(hi >>> 0);
  }

  /** The bytes written so far, copied out; the writer is then empty. */
  take() {
    const out = this.bytes.slice(0, this.length);
    this.length = 0;
    return out;
  }

  clear() {
    this.length = 0;
  }
}
