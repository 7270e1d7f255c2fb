// Command etcd is the etcd server of the version k8s.io/kubernetes pins in its go.mod, so the
// storage and the API server come from one module graph.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
