package eddy

import (
	"errors"
	"fmt"
)

// ErrorKind is the WIT's error-kind, in its order.
type ErrorKind uint8

const (
	// KindBadConfig: the configuration given to Open is unusable; retrying will not help.
	KindBadConfig ErrorKind = iota
	// KindBadRecord: a record could not be interpreted.
	KindBadRecord
	// KindFailed: anything else.
	KindFailed
)

func (k ErrorKind) String() string {
	switch k {
	case KindBadConfig:
		return "bad-config"
	case KindBadRecord:
		return "bad-record"
	default:
		return "failed"
	}
}

// OperatorError is a failure the operator reports on purpose; it becomes the WIT's
// operator-error with its kind and message.
type OperatorError struct {
	Kind    ErrorKind
	Message string
}

func (e *OperatorError) Error() string { return e.Kind.String() + ": " + e.Message }

// BadRecord reports a record the operator cannot interpret.
func BadRecord(format string, args ...any) error {
	return &OperatorError{KindBadRecord, fmt.Sprintf(format, args...)}
}

// BadConfig reports an unusable configuration.
func BadConfig(format string, args ...any) error {
	return &OperatorError{KindBadConfig, fmt.Sprintf(format, args...)}
}

// Failed reports any other failure.
func Failed(format string, args ...any) error {
	return &OperatorError{KindFailed, fmt.Sprintf(format, args...)}
}

// describe turns any error into the kind and message the host receives.
func describe(err error) *OperatorError {
	var oe *OperatorError
	if errors.As(err, &oe) {
		return oe
	}
	return &OperatorError{KindFailed, err.Error()}
}
