package simengine

import (
	"fmt"
	"strings"
)

// OutputBase is the first output token id; ids below it are prompt bytes.
const OutputBase = 256

// Vocab is the output vocabulary: token OutputBase+i detokenizes to Vocab[i].
var Vocab = func() []string {
	words := strings.Fields(`the of and to in is was for on that with as by at from it an be this which or are
	not but had his they you were her she there been one all we their has would when if can more no out so what
	up said about into than them some could only other new time two may then do first any like my now over such
	our man me even most made after also did many before must through back years where much your way well down
	should because each just those people how too little state good very make world still own see men work long
	get here between both life being under never day same another know while last might us great old year off
	come since against go came right used take three`)
	for i, w := range words {
		words[i] = " " + w
	}
	return words
}()

// VocabSize is the number of output tokens.
var VocabSize = len(Vocab)

// MaxTokenID is the largest valid token id.
func MaxTokenID() uint32 { return uint32(OutputBase + VocabSize - 1) }

// Encode tokenizes a prompt string: one token per UTF-8 byte.
func Encode(s string) []uint32 {
	out := make([]uint32, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = uint32(s[i])
	}
	return out
}

// Message is one chat message.
type Message struct {
	Role    string
	Content string
}

// RenderChat renders chat messages as the toy chat template:
// "<|role|>\ncontent\n" per message, then "<|assistant|>\n".
func RenderChat(msgs []Message) string {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "<|%s|>\n%s\n", m.Role, m.Content)
	}
	b.WriteString("<|assistant|>\n")
	return b.String()
}

// Decode detokenizes: bytes for prompt ids, words for output ids. An id
// past the vocabulary is an error.
func Decode(ids []uint32) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		switch {
		case id < OutputBase:
			b.WriteByte(byte(id))
		case int(id-OutputBase) < VocabSize:
			b.WriteString(Vocab[id-OutputBase])
		default:
			return "", fmt.Errorf("token id %d is outside the vocabulary (max %d)", id, MaxTokenID())
		}
	}
	return b.String(), nil
}

// TokenText is the text of one output token ("" for an unknown id).
func TokenText(id uint32) string {
	s, err := Decode([]uint32{id})
	if err != nil {
		return ""
	}
	return s
}
