package eddy

import "fmt"

// Level is a log level of the WIT's log interface, in its order.
type Level uint8

const (
	LevelTrace Level = iota
	LevelDebug
	LevelInfo
	LevelWarn
	LevelError
)

var logHost Base

// Logf writes a line to the host's log, which carries job, task, subtask and operator. Lines
// are cut to 4 KiB and rate-limited by the host.
func Logf(level Level, format string, args ...any) {
	if logHost != nil {
		logHost.Log(level, fmt.Sprintf(format, args...))
	}
}

// Infof logs at info level.
func Infof(format string, args ...any) { Logf(LevelInfo, format, args...) }

// Warnf logs at warn level.
func Warnf(format string, args ...any) { Logf(LevelWarn, format, args...) }

// Errorf logs at error level.
func Errorf(format string, args ...any) { Logf(LevelError, format, args...) }
