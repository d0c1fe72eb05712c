//! RocksDB is linked statically from Debian's `librocksdb-dev` (`ROCKSDB_STATIC` in
//! `.cargo/config.toml`): the shared library reached its thread-locals (the perf context RocksDB
//! touches on every read) through `__tls_get_addr`, 4-5% of a RocksDB-backed job's CPU. The
//! archive leaves its compression libraries to the final link; these are the shared ones the
//! Debian package depends on.
fn main() {
    println!("cargo:rerun-if-env-changed=ROCKSDB_STATIC");
    if std::env::var_os("ROCKSDB_STATIC").is_some() {
        for lib in ["snappy", "lz4", "zstd", "bz2", "z"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
}
