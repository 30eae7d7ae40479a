module github.com/cudamem/cudamem

go 1.24.0

require (
	github.com/ebitengine/purego v0.10.2
	github.com/google/pprof v0.0.0-20260709232956-b9395ee17fa0
	github.com/stretchr/testify v1.12.1
	golang.org/x/sys v0.41.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
