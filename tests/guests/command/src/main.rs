//! A WASI command component: valid wasm, wrong world.
fn main() {
    println!("hello from a command, not an operator");
}
