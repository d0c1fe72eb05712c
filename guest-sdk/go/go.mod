module eddy

go 1.24
