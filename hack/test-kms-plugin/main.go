// capn-test-kms-plugin: a KMS v2 plugin for the booted KMS test (tests/integration/boot_kms.rs),
// so that a tenant apiserver's `kms` provider talks to a real plugin over the real gRPC API
// (k8s.io/kms's pkg/service, the server half every KMS v2 plugin uses).
//
// It really encrypts: AES-256-GCM (Go's standard library) with a random key made at start
// and held in memory only, never logged or written, so what it encrypted cannot be read
// after it stops (as with a real KMS whose key is gone). It logs one line per Encrypt and
// Decrypt with a running count, so a test can tell the apiserver used it. The kube-apiserver
// calls Encrypt to wrap each data encryption key it makes (KMS v2 envelope encryption: not
// once per write) and Decrypt for each wrapped key it has not cached.
//
//	capn-test-kms-plugin --listen /run/kms/socket.sock [--key-id 1]
package main

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/kms/pkg/service"
)

// plugin is the Service the gRPC server calls.
type plugin struct {
	keyID    string
	aead     cipher.AEAD
	encrypts atomic.Int64
	decrypts atomic.Int64
}

// Status answers the apiserver's health and key-id checks (KMS v2: version "v2", healthz "ok").
func (p *plugin) Status(context.Context) (*service.StatusResponse, error) {
	return &service.StatusResponse{Version: "v2", Healthz: "ok", KeyID: p.keyID}, nil
}

// Encrypt seals data under the plugin's key: a fresh random nonce, then the sealed bytes,
// the key id as associated data (a value is bound to the key that wrote it).
func (p *plugin) Encrypt(_ context.Context, uid string, data []byte) (*service.EncryptResponse, error) {
	nonce := make([]byte, p.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("nonce: %w", err)
	}
	sealed := p.aead.Seal(nonce, nonce, data, []byte(p.keyID))
	n := p.encrypts.Add(1)
	log.Printf("encrypt count=%d uid=%s plaintext_bytes=%d key_id=%s", n, uid, len(data), p.keyID)
	return &service.EncryptResponse{Ciphertext: sealed, KeyID: p.keyID}, nil
}

// Decrypt opens what Encrypt sealed; a value of another key id, or one that does not
// authenticate, is an error (the apiserver then fails the read).
func (p *plugin) Decrypt(_ context.Context, uid string, req *service.DecryptRequest) ([]byte, error) {
	n := p.decrypts.Add(1)
	if req.KeyID != p.keyID {
		log.Printf("decrypt count=%d uid=%s refused: key id %q is not %q", n, uid, req.KeyID, p.keyID)
		return nil, fmt.Errorf("unknown key id %q", req.KeyID)
	}
	size := p.aead.NonceSize()
	if len(req.Ciphertext) < size {
		log.Printf("decrypt count=%d uid=%s refused: ciphertext too short", n, uid)
		return nil, errors.New("ciphertext too short")
	}
	plain, err := p.aead.Open(nil, req.Ciphertext[:size], req.Ciphertext[size:], []byte(p.keyID))
	if err != nil {
		log.Printf("decrypt count=%d uid=%s refused: %v", n, uid, err)
		return nil, fmt.Errorf("open: %w", err)
	}
	log.Printf("decrypt count=%d uid=%s plaintext_bytes=%d key_id=%s", n, uid, len(plain), p.keyID)
	return plain, nil
}

func main() {
	listen := flag.String("listen", "", "path of the unix socket to serve the KMS v2 API on (required)")
	keyID := flag.String("key-id", "1", "the key id reported by Status and Encrypt")
	flag.Parse()
	if *listen == "" {
		log.Fatal("--listen is required")
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		log.Fatalf("key: %v", err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		log.Fatalf("cipher: %v", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		log.Fatalf("gcm: %v", err)
	}
	p := &plugin{keyID: *keyID, aead: aead}
	// A socket left by an earlier run would make the listen fail.
	if info, err := os.Lstat(*listen); err == nil && info.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(*listen)
	}
	// The apiserver runs as another user (capn's images: 65532) and needs write permission
	// on the socket to connect; the listener is made inside ListenAndServe, so the mode
	// comes from the umask (the plugin writes no other file).
	syscall.Umask(0o111)
	server := service.NewGRPCService(*listen, 10*time.Second, p)
	// SIGTERM or SIGINT: stop at once; closing the listener removes the socket.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		server.Close()
	}()
	log.Printf("serving KMS v2 on %s, key id %s", *listen, *keyID)
	if err := server.ListenAndServe(); err != nil && !errors.Is(err, context.Canceled) {
		log.Printf("stopped: %v", err)
	}
	log.Printf("stopped after %d encrypt and %d decrypt calls", p.encrypts.Load(), p.decrypts.Load())
}
