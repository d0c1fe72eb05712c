module frauddetector

go 1.24

require eddy v0.0.0

// `eddy build` writes the Eddy Go SDK here.
replace eddy => ./build/eddy-go
