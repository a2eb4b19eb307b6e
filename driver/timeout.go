package driver

import "errors"

// IsTimeout reports whether err is (or wraps) a driver Error for a call that did not
// answer within its deadline: the one driver failure worth asking again, since a
// loaded machine can make a sound driver miss it once.
func IsTimeout(err error) bool {
	var de *Error
	return errors.As(err, &de) && de.Kind == "timeout"
}
