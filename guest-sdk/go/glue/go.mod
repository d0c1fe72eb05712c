// The SDK's side of the bindings wit-bindgen-go generates: `eddy build` copies these packages
// into the module it generates (module wit_component), where they compile; on their own they
// do not (this go.mod keeps them out of the eddy module).
module wit_component

go 1.24
