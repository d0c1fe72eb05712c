//! A component that claims the Eddy operator export but lacks functions.

wit_bindgen::generate!({ world: "broken", path: "wit" });

struct Broken;

impl exports::eddy::dataflow::operator::Guest for Broken {
    fn open(_config: String) -> Result<(), String> {
        Ok(())
    }
    fn process(_records: Vec<u8>) -> Result<(), String> {
        Ok(())
    }
}

export!(Broken);
